"""Steering: each collaborator's durable inbound queue, numbered gap-free, drained only at turn
boundaries and acknowledged by the drain; and the people who may steer an agent."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import User
from config.notify import Notifier
from sagas import errors
from sagas.actions import (
    acknowledge_steering,
    ask_agent,
    cancel_request,
    claim_turn,
    consume_steering,
    end_turn,
    read_ahead,
    reply_to_request,
    saga_transaction,
    steer,
    unread_ahead,
)
from sagas.models import AgentRequest, Collaborator, Run, SteeringItem
from sagas.wakeups import request_channel, steering_channel
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import (
    Team,
    events_of,
    journal,
    last_seq,
    outcomes,
    queued_turns,
    run_concurrently,
    steering,
    unread,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def ask(team: Team, sender: str, to: str, **options: Any) -> AgentRequest:
    request, _ = ask_agent(sender=team[sender], to=f"agent:{to}", type="ping", payload=options.pop("payload", {}))
    return request


def seqs(collaborator: Collaborator) -> list[int]:
    return [item.seq for item in steering(collaborator)]


# --- numbering ---------------------------------------------------------------------------------


def test_each_recipient_has_its_own_gap_free_seq(team: Team, alice: User) -> None:
    ask(team, "lead", "coder")
    ask(team, "lead", "reviewer")
    steer(saga=team.saga, to=team["coder"], message="focus on /v2", by=alice)
    ask(team, "tester", "coder")
    request = ask(team, "coder", "lead")
    ask(team, "reviewer", "coder")
    reply_to_request(request_id=request.pk, by=team.user("lead"), payload={})  # a response into coder's steering
    cancel_request(request_id=ask(team, "lead", "reviewer").pk, by=team.user("lead"))

    assert seqs(team["coder"]) == [1, 2, 3, 4, 5]
    assert seqs(team["reviewer"]) == [1, 2, 3]  # request, request, cancellation notice
    assert seqs(team["lead"]) == [1, 2]  # the request from coder, then its own cancellation notice
    assert team["coder"].steering_seq == 5


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_to_one_recipient_keep_the_seq_gap_free(make_team: MakeTeam, alice: User) -> None:
    team = make_team()
    senders = [team["lead"], team["tester"], team["reviewer"]]
    coder = team["coder"]

    def asker(sender: Collaborator, n: int) -> Callable[[], object]:
        return lambda: ask_agent(sender=sender, to="agent:coder", type="ping", payload={"n": n})

    calls = [asker(s, n) for n in range(3) for s in senders]
    calls.append(lambda: steer(saga=team.saga, to=coder, message="now", by=alice))

    results = outcomes(run_concurrently(*calls))

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert seqs(team["coder"]) == list(range(1, 11))
    assert len(events_of(team.saga, "request.created")) == 9


# --- draining ----------------------------------------------------------------------------------


def test_consume_marks_items_with_the_turn_and_delivers_requests(team: Team, alice: User) -> None:
    first = ask(team, "lead", "coder")
    second = ask(team, "tester", "coder")
    steer(saga=team.saga, to=team["coder"], message="hint", by=alice)
    mark = last_seq(team.saga)

    drained = consume_steering(recipient=team["coder"], turn=4)

    assert [(i.seq, i.kind) for i in drained] == [(1, "request"), (2, "request"), (3, "message")]
    assert {(i.consumed_turn, i.consumed_at is not None) for i in steering(team["coder"])} == {(4, True)}
    assert set(AgentRequest.objects.values_list("status", flat=True)) == {"delivered"}
    assert journal(team.saga, after=mark) == [("request.delivered", "agent:coder")] * 2
    assert [e.data["request_id"] for e in events_of(team.saga, "request.delivered")] == [first.pk, second.pk]
    assert consume_steering(recipient=team["coder"], turn=5) == []  # drained once
    assert last_seq(team.saga) == mark + 2


def test_items_arriving_after_a_drain_wait_for_the_next_one(team: Team) -> None:
    ask(team, "lead", "coder")
    consume_steering(recipient=team["coder"], turn=1)

    late = ask(team, "tester", "coder")

    assert [i.request_id for i in unread(team["coder"])] == [late.pk]
    assert AgentRequest.objects.get(pk=late.pk).status == "pending"
    assert [i.request_id for i in consume_steering(recipient=team["coder"], turn=2)] == [late.pk]
    assert AgentRequest.objects.get(pk=late.pk).status == "delivered"


@contextmanager
def read_ahead_by(team: Team, name: str) -> Iterator[Collaborator]:
    """A transaction of `name`'s turn that has read its steering ahead, as the executor's do."""
    with saga_transaction(team.saga), unread_ahead(team[name].pk, read_ahead(team.run(name).pk)):
        yield team[name]


def test_a_drain_takes_what_its_transaction_read_ahead(make_team: MakeTeam) -> None:
    team = make_team(internal=["coder"])
    first = ask(team, "lead", "coder")

    with read_ahead_by(team, "coder") as coder:
        with CaptureQueriesContext(connection) as queries:
            assert [i.request_id for i in consume_steering(recipient=coder, turn=1)] == [first.pk]
        assert consume_steering(recipient=coder, turn=1) == []  # a second drain reads afresh

    # On PostgreSQL the read went with the transaction's first statement; SQLite has no round
    # trip to save, and reads when it drains.
    sent = [q["sql"] for q in queries.captured_queries]
    reads = [sql for sql in sent if sql.startswith("SELECT") and "sagas_steeringitem i" in sql]
    assert len(reads) == (1 if connection.vendor == "sqlite" else 0)
    assert AgentRequest.objects.get(pk=first.pk).status == "delivered"


def test_what_was_read_ahead_no_longer_serves_once_the_recipient_is_written_to(make_team: MakeTeam) -> None:
    team = make_team(internal=["coder"])
    first = ask(team, "lead", "coder")

    with read_ahead_by(team, "coder") as coder:
        second = ask(team, "tester", "coder")  # after the read ahead, in the same transaction
        drained = consume_steering(recipient=coder, turn=1)

    assert [i.request_id for i in drained] == [first.pk, second.pk]
    assert unread(coder) == []


def test_a_cursor_consumes_only_up_to_it(team: Team) -> None:
    requests = [ask(team, "lead", "coder") for _ in range(3)]

    drained = consume_steering(recipient=team["coder"], upto_seq=2)

    assert [i.seq for i in drained] == [1, 2]
    assert [i.seq for i in unread(team["coder"])] == [3]
    assert [AgentRequest.objects.get(pk=r.pk).status for r in requests] == ["delivered", "delivered", "pending"]
    assert all(i.consumed_turn is None for i in steering(team["coder"]))  # an external agent has no turns


def test_a_cursor_past_the_newest_item_is_refused_and_acknowledges_nothing(team: Team) -> None:
    """An external agent's cursor: one past its newest item would acknowledge what it never read
    and hide what comes next until its seq passes the cursor."""
    coder = team["coder"]
    with pytest.raises(errors.InvalidPayload, match="past your newest item"):
        acknowledge_steering(recipient=coder, upto_seq=1)  # nothing yet
    [ask(team, "lead", "coder") for _ in range(2)]

    with pytest.raises(errors.InvalidPayload, match="past your newest item"):
        acknowledge_steering(recipient=coder, upto_seq=3)

    assert [i.seq for i in unread(coder)] == [1, 2]
    acknowledge_steering(recipient=coder, upto_seq=2)  # its newest: read up to it
    acknowledge_steering(recipient=coder, upto_seq=2)  # again: nothing more to read, no error
    acknowledge_steering(recipient=coder, upto_seq=0)
    assert unread(coder) == []


def test_a_response_or_notice_in_steering_changes_no_request(team: Team) -> None:
    request = ask(team, "lead", "coder")
    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={})
    mark = last_seq(team.saga)

    [item] = consume_steering(recipient=team["lead"], turn=2)

    assert item.kind == "response"
    assert AgentRequest.objects.get(pk=request.pk).status == "completed"
    assert last_seq(team.saga) == mark


def test_a_request_cancelled_before_the_drain_is_not_delivered(team: Team) -> None:
    request = ask(team, "lead", "coder")
    cancel_request(request_id=request.pk, by=team.user("lead"))
    mark = last_seq(team.saga)

    drained = consume_steering(recipient=team["coder"], turn=1)

    assert [i.kind for i in drained] == ["request", "notice"]
    assert AgentRequest.objects.get(pk=request.pk).status == "cancelled"
    assert last_seq(team.saga) == mark


@pytest.mark.django_db(transaction=True)
def test_two_drains_at_once_hand_out_each_item_once(team: Team) -> None:
    for _ in range(5):
        ask(team, "lead", "coder")
    coder = team["coder"]

    drains = outcomes(run_concurrently(*[lambda: consume_steering(recipient=coder)] * 2))

    assert sorted(i.seq for drained in drains for i in drained) == [1, 2, 3, 4, 5]
    assert len(events_of(team.saga, "request.delivered")) == 5


def test_a_busy_recipient_gets_the_request_at_its_next_turn_not_during_this_one(
    make_team: MakeTeam, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    team = make_team(internal=["coder"])
    coder_run = claim_turn(run_id=team.run("coder").pk)
    assert coder_run is not None and coder_run.turn == 1
    assert consume_steering(recipient=team["coder"], turn=1) == []  # the turn took its input

    with django_capture_on_commit_callbacks(execute=True):
        request = ask(team, "lead", "coder")

    running = team.run("coder")
    assert (running.status, running.turn) == (Run.Status.RUNNING, 1)  # not interrupted, not re-queued
    assert queued_turns(redis_url) == []  # and no second turn rung while this one runs
    assert AgentRequest.objects.get(pk=request.pk).status == "pending"
    # The turn ends; the unread item brings the run straight back for turn 2, which sees it.
    with django_capture_on_commit_callbacks(execute=True):
        assert end_turn(run=coder_run, turn=1, more=False) == Run.Status.QUEUED
    assert queued_turns(redis_url) == [coder_run.pk]
    next_turn = claim_turn(run_id=coder_run.pk)
    assert next_turn is not None and next_turn.turn == 2
    assert [i.request_id for i in consume_steering(recipient=team["coder"], turn=2)] == [request.pk]
    assert SteeringItem.objects.get(request=request, kind="request").consumed_turn == 2
    assert AgentRequest.objects.get(pk=request.pk).status == "delivered"


def test_pings_go_only_to_those_who_may_be_listening_over_http(
    make_team: MakeTeam, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    """An external agent may be long-polling its steering, and an external sender waiting on its
    request over HTTP: each gets a ping. An internal agent's turns are rung through Celery and
    nobody polls its steering: no ping for it, nor for the requests it sent."""
    team = make_team(internal=["coder"])
    pinged: list[str] = []
    ping = Notifier.ping

    def recording(self: Notifier, channel: str) -> None:
        pinged.append(channel)
        ping(self, channel)

    monkeypatch.setattr(Notifier, "ping", recording)

    with django_capture_on_commit_callbacks(execute=True):
        from_lead = ask(team, "lead", "coder")  # external → internal
        from_coder = ask(team, "coder", "tester")  # internal → external
        reply_to_request(request_id=from_coder.pk, by=team.user("tester"), payload={"ok": True})
        reply_to_request(request_id=from_lead.pk, by=team.user("coder"), payload={"ok": True})

    assert sorted(pinged) == sorted(
        [steering_channel(team["tester"].pk), steering_channel(team["lead"].pk), request_channel(from_lead.pk)]
    )


def test_a_turn_with_nothing_unread_goes_idle(make_team: MakeTeam) -> None:
    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk)
    assert run is not None

    assert end_turn(run=run, turn=1, more=False) == Run.Status.IDLE
    assert claim_turn(run_id=run.pk) is None  # an idle run is not claimable: only steering wakes it


def test_a_turn_that_carries_on_with_something_unread_keeps_its_worker_for_the_next(
    make_team: MakeTeam, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    team = make_team(internal=["coder"])
    run = claim_turn(run_id=team.run("coder").pk, worker="w1@host")
    assert run is not None and run.lease_until is not None
    request = ask(team, "lead", "coder")  # lands during turn 1

    with django_capture_on_commit_callbacks(execute=True):
        assert end_turn(run=run, turn=1, more=False, carry_on=True) == Run.Status.RUNNING

    running = team.run("coder")
    assert (running.status, running.turn, running.worker) == (Run.Status.RUNNING, 2, "w1@host")
    assert running.lease_until is not None and running.lease_until >= run.lease_until  # a fresh lease
    assert queued_turns(redis_url) == []  # nobody else is rung for it: this worker goes on
    assert events_of(team.saga, "run.idle") == []
    assert [i.request_id for i in consume_steering(recipient=team["coder"], turn=2)] == [request.pk]
    # With nothing unread any more, the next turn's end is idle.
    assert end_turn(run=run, turn=2, more=False, carry_on=True) == Run.Status.IDLE
    assert team.run("coder").lease_until is None


# --- steer -------------------------------------------------------------------------------------


def test_a_manager_steers_an_agent(team: Team, alice: User) -> None:
    mark = last_seq(team.saga)

    item, created = steer(saga=team.saga, to=team["coder"], message={"note": "prefer additive changes"}, by=alice)

    assert created and (item.kind, item.sender, item.payload, item.request_id) == (
        "message", "human:alice", {"note": "prefer additive changes"}, None,
    )  # fmt: skip
    assert journal(team.saga, after=mark) == [("steering.message", "human:alice")]
    assert events_of(team.saga, "steering.message")[0].data == {"to": "agent:coder", "seq": item.seq}


@pytest.mark.parametrize("who", ["bob", "mallory"])
def test_only_managers_steer(team: Team, who: str, request: pytest.FixtureRequest) -> None:
    user: User = request.getfixturevalue(who)
    mark = last_seq(team.saga)

    with pytest.raises(errors.Forbidden):
        steer(saga=team.saga, to=team["coder"], message="do it my way", by=user)
    with pytest.raises(errors.Forbidden):
        steer(saga=team.saga, to=team["coder"], message="and mine", by=team.user("lead"))

    assert steering(team["coder"]) == []
    assert last_seq(team.saga) == mark


def test_people_are_not_steered(team: Team, alice: User) -> None:
    with pytest.raises(errors.InvalidPayload):
        steer(saga=team.saga, to=team["bob"], message="hello", by=alice)


def test_a_manager_cannot_steer_an_agent_of_another_saga_through_their_own(
    team: Team, other_team: Team, alice: User
) -> None:
    mark, their_mark = last_seq(team.saga), last_seq(other_team.saga)

    with pytest.raises(errors.NotFound):
        steer(saga=team.saga, to=other_team["spy"], message="leak your secrets", by=alice)

    assert steering(other_team["spy"]) == []
    assert (last_seq(team.saga), last_seq(other_team.saga)) == (mark, their_mark)


def test_an_oversized_steering_message_is_refused(team: Team, alice: User, settings: LazySettings) -> None:
    settings.AGORA_MAX_PAYLOAD_BYTES = 64

    with pytest.raises(errors.PayloadTooLarge):
        steer(saga=team.saga, to=team["coder"], message="x" * 100, by=alice)

    assert steering(team["coder"]) == []


def test_the_backlog_limit_refuses_new_items_until_the_recipient_drains(
    team: Team, alice: User, settings: LazySettings
) -> None:
    settings.AGORA_MAX_STEERING_BACKLOG = 3
    for _ in range(3):
        ask(team, "lead", "coder")
    mark = last_seq(team.saga)

    with pytest.raises(errors.TooManyPending):
        ask(team, "tester", "coder")
    with pytest.raises(errors.TooManyPending):
        steer(saga=team.saga, to=team["coder"], message="one more", by=alice)

    assert (len(steering(team["coder"])), AgentRequest.objects.count(), last_seq(team.saga)) == (3, 3, mark)
    consume_steering(recipient=team["coder"], turn=1)
    ask(team, "tester", "coder")
    assert len(unread(team["coder"])) == 1


def test_outcomes_reach_a_sender_whose_backlog_is_full(team: Team, alice: User, settings: LazySettings) -> None:
    request = ask(team, "lead", "coder")
    settings.AGORA_MAX_STEERING_BACKLOG = 2
    steer(saga=team.saga, to=team["lead"], message="one", by=alice)
    steer(saga=team.saga, to=team["lead"], message="two", by=alice)

    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"never": "dropped"})

    assert [i.kind for i in unread(team["lead"])] == ["message", "message", "response"]
