"""The reconciler: the database is the source of truth and Redis only rings doorbells, so
`sagas.tasks.reconcile` re-rings every bell that should have rung. Time moves with a fake clock
in-process; a worker process (which has the real clock) gets its state arranged in the past."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from redis import Redis

from agents.actions import load_profiles
from sagas import errors
from sagas.actions import (
    allow_remote_agent,
    ask_agent,
    call_remote_agent,
    cancel_request,
    claim_remote_step,
    claim_turn,
    consume_steering,
    end_turn,
    park_on_request,
    renew_lease,
    reply_to_request,
)
from sagas.models import AgentRequest, Run
from sagas.tasks import reconcile
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import (
    Clock,
    Team,
    events_of,
    journal,
    kinds,
    last_seq,
    outcomes,
    queued_turns,
    run_concurrently,
    steering,
)
from tests.support import CeleryWorker, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

NOTHING = {"waits_ended": 0, "expired": 0, "teammates_shut_down": 0, "runs_rung": 0, "remote_calls_rung": 0}


def ask(team: Team, sender: str = "lead", to: str = "coder", **options: Any) -> AgentRequest:
    request, _ = ask_agent(sender=team[sender], to=f"agent:{to}", type="ping", payload={"q": 1}, **options)
    return request


def park(team: Team, name: str, request: AgentRequest) -> Run:
    """Claim a turn of an internal run, wait on `request` in it, and end the turn parked."""
    run = Run.objects.get(collaborator=team[name])
    if run.status != Run.Status.RUNNING:
        claimed = claim_turn(run_id=run.pk)
        assert claimed is not None
        run = claimed
    park_on_request(run=run, turn=run.turn, request_id=request.pk, tool_call_id="call-1")
    assert end_turn(run=run, turn=run.turn, more=False) == Run.Status.WAITING
    return run


# --- wait deadlines ----------------------------------------------------------------------------


def test_a_due_wait_deadline_ends_the_wait_and_the_request_stays_pending(team: Team, clock: Clock) -> None:
    request = ask(team, mode="wait", timeout_s=30)
    clock.advance(29)
    assert reconcile() == NOTHING
    mark = last_seq(team.saga)
    clock.advance(2)

    assert reconcile() == {**NOTHING, "waits_ended": 1}

    stored = AgentRequest.objects.get(pk=request.pk)
    assert (stored.status, stored.wait_deadline) == ("pending", None)
    assert journal(team.saga, after=mark) == [("request.wait_timed_out", "agent:lead")]
    assert events_of(team.saga, "request.wait_timed_out")[0].data == {"request_id": request.pk, "status": "pending"}
    assert reconcile() == NOTHING
    assert last_seq(team.saga) == mark + 1


def test_the_reply_after_a_wait_timeout_still_reaches_the_sender_through_steering(team: Team, clock: Clock) -> None:
    request = ask(team, mode="wait", timeout_s=30)
    clock.advance(31)
    reconcile()

    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"late": "but here"})

    [item] = steering(team["lead"])
    assert (item.kind, item.request_id, item.payload) == ("response", request.pk, {"late": "but here"})
    assert AgentRequest.objects.get(pk=request.pk).status == "completed"


def test_a_timed_out_wait_resumes_the_parked_sender(
    make_team: MakeTeam, clock: Clock, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    team = make_team(internal=["lead"])
    request = ask(team, mode="wait", timeout_s=30)
    lead_run = park(team, "lead", request)
    clock.advance(31)

    with django_capture_on_commit_callbacks(execute=True):
        counts = reconcile()

    assert counts["waits_ended"] == 1
    resumed = team.run("lead")
    assert (resumed.status, resumed.wait_until, resumed.waiting_on_id) == ("queued", None, request.pk)
    assert set(queued_turns(redis_url)) == {lead_run.pk}


# --- TTL ---------------------------------------------------------------------------------------


def test_ttl_expiry_is_terminal_with_notices_to_both_sides(team: Team, clock: Clock, settings: LazySettings) -> None:
    settings.AGORA_REQUEST_TTL_S = 60
    request = ask(team)
    consume_steering(recipient=team["coder"])  # delivered, then never answered
    clock.advance(59)
    assert reconcile() == NOTHING
    mark = last_seq(team.saga)
    clock.advance(2)

    assert reconcile() == {**NOTHING, "expired": 1}

    expired = AgentRequest.objects.get(pk=request.pk)
    assert expired.status == "expired" and expired.expires_at is not None
    assert expired.error == {"code": "expired", "message": f"No reply before {expired.expires_at.isoformat()}."}
    assert kinds(team["lead"]) == [("notice", request.pk)]
    assert kinds(team["coder"]) == [("request", request.pk), ("notice", request.pk)]
    assert steering(team["coder"])[-1].payload == {"status": "expired"}
    assert journal(team.saga, after=mark) == [("request.expired", "system")]
    with pytest.raises(errors.RequestClosed):
        reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"too": "late"})
    with pytest.raises(errors.RequestClosed):
        cancel_request(request_id=request.pk, by=team.user("lead"))
    assert reconcile() == NOTHING
    assert last_seq(team.saga) == mark + 1


def test_answered_requests_never_expire(team: Team, clock: Clock, settings: LazySettings) -> None:
    settings.AGORA_REQUEST_TTL_S = 60
    request = ask(team)
    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={})
    clock.advance(3600)

    assert reconcile() == NOTHING
    assert AgentRequest.objects.get(pk=request.pk).status == "completed"


# --- runs --------------------------------------------------------------------------------------


def test_an_expired_lease_is_reclaimed_and_its_turn_rung_again(
    make_team: MakeTeam, clock: Clock, redis_url: str, settings: LazySettings
) -> None:
    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk)
    assert run is not None and run.lease_until == clock.now + timedelta(seconds=settings.AGORA_LEASE_S)
    clock.advance(settings.AGORA_LEASE_S - 1)
    assert reconcile()["runs_rung"] == 0
    assert team.run("coder").status == Run.Status.RUNNING
    clock.advance(2)  # the worker died: nobody renewed the lease

    assert reconcile()["runs_rung"] == 1

    reclaimed = team.run("coder")
    assert (reclaimed.status, reclaimed.lease_until, reclaimed.turn) == ("queued", None, 1)
    assert queued_turns(redis_url) == [run.pk]
    retry = claim_turn(run_id=run.pk)
    assert retry is not None and retry.turn == 2
    assert not renew_lease(run_id=run.pk, turn=1)  # the dead worker's turn is gone for good
    current = team.run("coder")
    assert (current.status, current.turn) == (Run.Status.RUNNING, 2)  # the new claim holds it, not turn 1


def test_the_run_names_the_worker_of_each_turn_and_a_reclaim_names_the_one_that_lost_it(
    make_team: MakeTeam, clock: Clock, settings: LazySettings, alice: Any, mallory: Any
) -> None:
    from tests.sagas.api_http import client_for

    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk, worker="w1@host-a")
    assert run is not None and team.run("coder").worker == "w1@host-a"
    clock.advance(settings.AGORA_LEASE_S + 1)  # host-a died
    reconcile()
    retry = claim_turn(run_id=run.pk, worker="w2@host-b")
    assert retry is not None
    assert end_turn(run=retry, turn=2, more=False) == Run.Status.IDLE

    assert [e.data["lost_by"] for e in events_of(team.saga, "run.reclaimed")] == ["w1@host-a"]
    assert [e.data["worker"] for e in events_of(team.saga, "run.idle")] == ["w2@host-b"]
    shown = client_for(alice).get(f"/api/v1/runs/{run.pk}/status/")  # alice manages the saga
    assert shown.status_code == 200 and shown.json() == {"run_id": run.pk, "status": "idle", "worker": "w2@host-b"}
    assert client_for(mallory).get(f"/api/v1/runs/{run.pk}/status/").status_code == 404


def test_a_live_lease_is_left_alone_and_renewing_it_keeps_it(
    make_team: MakeTeam, clock: Clock, settings: LazySettings
) -> None:
    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk)
    assert run is not None
    for _ in range(3):
        clock.advance(settings.AGORA_LEASE_S - 1)
        assert renew_lease(run_id=run.pk, turn=1)
        assert reconcile()["runs_rung"] == 0

    assert team.run("coder").status == Run.Status.RUNNING


def test_an_idle_internal_run_with_unread_steering_is_queued_and_rung(
    make_team: MakeTeam, clock: Clock, redis_url: str, settings: LazySettings
) -> None:
    team = make_team(internal=["coder", "reviewer"])
    for name in ("coder", "reviewer"):
        run = claim_turn(run_id=team.run(name).pk)
        assert run is not None and end_turn(run=run, turn=1, more=False) == Run.Status.IDLE
    ask(team, to="coder")
    # Arrange what a lost race would leave: idle, with an unread item (wake() normally queues it).
    Run.objects.filter(pk=team.run("coder").pk).update(status=Run.Status.IDLE)

    assert reconcile()["runs_rung"] == 1

    assert team.run("coder").status == Run.Status.QUEUED
    assert team.run("reviewer").status == Run.Status.IDLE  # nothing to read: stays idle
    assert queued_turns(redis_url) == [team.run("coder").pk]


def test_external_runs_are_never_rung(team: Team, clock: Clock, redis_url: str) -> None:
    ask(team)
    clock.advance(3600)

    assert reconcile()["runs_rung"] == 0
    assert team.run("coder").status == Run.Status.IDLE
    assert queued_turns(redis_url) == []


def test_a_run_parked_past_its_deadline_is_queued(make_team: MakeTeam, clock: Clock, redis_url: str) -> None:
    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk)
    assert run is not None
    end_turn(run=run, turn=1, more=False)
    # A parked run with no request edge for end_wait to find: only its own deadline frees it.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.WAITING, wait_until=clock.now + timedelta(seconds=30))
    clock.advance(31)

    assert reconcile()["runs_rung"] == 1

    freed = team.run("coder")
    assert (freed.status, freed.wait_until) == ("queued", None)
    assert queued_turns(redis_url) == [run.pk]


def test_a_queued_run_whose_doorbell_was_lost_is_rung_again_spaced_out(
    make_team: MakeTeam, clock: Clock, redis_url: str, settings: LazySettings
) -> None:
    team = make_team(internal=["coder"])  # queued; in this test its first ring never left the transaction
    run_id = team.run("coder").pk
    assert reconcile()["runs_rung"] == 0  # its doorbell may still be on its way
    clock.advance(settings.AGORA_RERING_S + 1)

    assert reconcile()["runs_rung"] == 1
    assert reconcile()["runs_rung"] == 0  # re-rung at most once per interval
    clock.advance(settings.AGORA_RERING_S + 1)
    assert reconcile()["runs_rung"] == 1

    assert queued_turns(redis_url) == [run_id, run_id]


# --- two reconcilers ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_reconcilers_at_once_do_each_thing_once(
    make_team: MakeTeam, clock: Clock, redis_url: str, settings: LazySettings
) -> None:
    settings.AGORA_REQUEST_TTL_S = 120
    team = make_team(internal=["scout", "tester"])
    waits = [
        ask(team, sender=s, to=r, mode="wait", timeout_s=30) for s, r in [("lead", "coder"), ("coder", "reviewer")]
    ]
    expiring = [ask(team, sender="reviewer", to="lead"), ask(team, sender="lead", to="reviewer")]
    clock.advance(60)  # the waits are due
    assert reconcile()["waits_ended"] == 2
    waits += [ask(team, sender="reviewer", to="coder", mode="wait", timeout_s=30)]
    clock.advance(61)  # now the first requests' TTL has passed, and the last wait is due
    Redis.from_url(redis_url).flushdb()  # the runs' first doorbells are lost too
    mark = last_seq(team.saga)

    results = outcomes(run_concurrently(reconcile, reconcile))

    assert all(isinstance(r, dict) for r in results), results
    totals = {key: sum(r[key] for r in results) for key in NOTHING}
    assert totals == {"waits_ended": 1, "expired": 4, "teammates_shut_down": 0, "runs_rung": 2, "remote_calls_rung": 0}
    assert {r.pk: r.status for r in AgentRequest.objects.all()} == {
        **{r.pk: "expired" for r in waits[:2] + expiring},
        waits[2].pk: "pending",
    }
    new = journal(team.saga, after=mark)
    assert sorted(new) == sorted([("request.wait_timed_out", "agent:reviewer")] + [("request.expired", "system")] * 4)
    for request in waits[:2] + expiring:
        assert len([e for e in events_of(team.saga, "request.expired") if e.data["request_id"] == request.pk]) == 1
    assert sorted(queued_turns(redis_url)) == sorted([team.run("scout").pk, team.run("tester").pk])


# --- through real processes --------------------------------------------------------------------


@pytest.mark.integration
def test_reconcile_in_a_real_worker_expires_due_requests(team: Team, celery_worker: CeleryWorker) -> None:
    request = ask(team)
    # The worker's clock is real: arrange the expiry in the past instead of moving time.
    AgentRequest.objects.filter(pk=request.pk).update(expires_at=request.created_at - timedelta(seconds=1))

    reconcile.delay()

    wait_until(
        lambda: AgentRequest.objects.get(pk=request.pk).status == "expired",
        what=f"the worker's reconciler to expire {request.pk}",
    )
    assert kinds(team["lead"]) == [("notice", request.pk)]
    assert [(e.type, e.actor) for e in events_of(team.saga, "request.expired")] == [("request.expired", "system")]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_after_redis_is_flushed_the_reconciler_restores_delivery(
    make_team: MakeTeam, clock: Clock, redis_url: str, settings: LazySettings
) -> None:
    team = make_team(internal=["coder"])
    coder_run = claim_turn(run_id=team.run("coder").pk)
    assert coder_run is not None and end_turn(run=coder_run, turn=1, more=False) == Run.Status.IDLE
    Redis.from_url(redis_url).flushdb()  # forget the first turn's doorbell
    request = ask(team)
    assert team.run("coder").status == Run.Status.QUEUED
    assert queued_turns(redis_url) == [coder_run.pk]  # rung after commit...

    Redis.from_url(redis_url).flushdb()  # ...and lost
    assert queued_turns(redis_url) == []
    clock.advance(settings.AGORA_RERING_S + 1)
    assert reconcile()["runs_rung"] == 1

    assert queued_turns(redis_url) == [coder_run.pk]
    next_turn = claim_turn(run_id=coder_run.pk)
    assert next_turn is not None and next_turn.turn == 2
    assert [i.request_id for i in consume_steering(recipient=team["coder"], turn=2)] == [request.pk]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_after_redis_is_flushed_a_real_worker_runs_the_restored_turn_and_the_reply_arrives(
    make_team: MakeTeam, redis_url: str, artifacts: Path, settings: LazySettings
) -> None:
    load_profiles(
        entries=[{"name": "responder", "role": "Responder", "system_prompt": "Answer every request.",
                  "tools": ["reply", "finish"], "model": "scripted:responder", "max_turns": 100}]
    )  # fmt: skip
    team = make_team(internal=["coder"], profile="responder")
    Run.objects.filter(pk=team.run("coder").pk).update(status=Run.Status.IDLE)  # as if its first turn were over
    Redis.from_url(redis_url).flushdb()  # and its doorbell gone with it
    request = ask(team)
    coder_run = team.run("coder")
    assert (coder_run.status, queued_turns(redis_url)) == ("queued", [coder_run.pk])
    Redis.from_url(redis_url).flushdb()  # the request's doorbell is lost before any worker saw it
    # The worker's clock is real: date the last ring back past the re-ring interval.
    Run.objects.filter(pk=coder_run.pk).update(
        updated_at=coder_run.updated_at - timedelta(seconds=settings.AGORA_RERING_S + 1)
    )

    worker = CeleryWorker(redis_url, artifacts)
    try:
        reconcile.delay()
        wait_until(
            lambda: AgentRequest.objects.get(pk=request.pk).status == "completed",
            timeout=30,
            what=f"agent:coder's restored turn to answer {request.pk}\n{worker.log()[-3000:]}",
        )
    finally:
        worker.stop()

    assert Run.objects.get(pk=coder_run.pk).turn >= 1  # an agents.tasks.run_turn message was received and run
    [response] = steering(team["lead"])
    assert (response.kind, response.request_id, response.payload) == ("response", request.pk, {"echo": {"q": 1}})
    assert [(e.type, e.actor) for e in events_of(team.saga, "request.completed")] == [
        ("request.completed", "agent:coder")
    ]


# --- calls to remote A2A agents ----------------------------------------------------------------


def test_a_remote_call_whose_step_was_lost_is_rung_again_once_per_interval(
    make_team: MakeTeam, clock: Clock, settings: LazySettings
) -> None:
    team = make_team()
    allow_remote_agent(saga=team.saga, name="x", url="https://agents.example.com/a2a/x/", by=team.saga.owner)
    call, _ = call_remote_agent(caller=team["coder"], agent="x", message="hi", timeout_s=300)
    assert reconcile()["remote_calls_rung"] == 0  # its doorbell may still be on its way
    clock.advance(settings.AGORA_RERING_S + 1)
    assert reconcile()["remote_calls_rung"] == 1
    assert reconcile()["remote_calls_rung"] == 0  # re-rung at most once per interval

    claimed = claim_remote_step(call_id=call.pk, step=0, lease_s=30)
    assert claimed is not None and claimed.step == 1
    assert claim_remote_step(call_id=call.pk, step=0, lease_s=30) is None  # a duplicated doorbell
    assert claim_remote_step(call_id=call.pk, step=1, lease_s=30) is None  # the lease is held
    clock.advance(31)  # its worker died during the step
    assert reconcile()["remote_calls_rung"] == 1
    assert claim_remote_step(call_id=call.pk, step=1, lease_s=30) is not None
