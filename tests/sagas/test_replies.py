"""Outcomes of a request: replies, errors, cancellation, their races, and the terminal states that
finishing a run forces on requests addressed to it."""

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
from django.conf import LazySettings

from accounts.models import User
from sagas import errors
from sagas.actions import (
    ask_agent,
    cancel_request,
    claim_turn,
    consume_steering,
    end_turn,
    finish_run,
    park_on_request,
    reply_to_request,
    saga_transaction,
    set_external_status,
    steer,
)
from sagas.models import AgentRequest, Delegation, Run, SteeringItem
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import (
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

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def ask(team: Team, sender: str = "lead", to: str = "coder", **options: Any) -> AgentRequest:
    options.setdefault("payload", {"question": "compatible?"})
    request, _ = ask_agent(sender=team[sender], to=f"agent:{to}", type="compatibility.check", **options)
    return request


# --- replies -----------------------------------------------------------------------------------


def test_the_reply_lands_in_the_senders_steering_as_a_response(team: Team) -> None:
    request = ask(team)
    mark = last_seq(team.saga)
    answer = {"compatible": False, "reason": "The API change breaks backward compatibility."}

    replied = reply_to_request(request_id=request.pk, by=team.user("coder"), payload=answer)

    assert (replied.status, replied.reply, replied.error, replied.wait_deadline) == ("completed", answer, None, None)
    [item] = steering(team["lead"])
    assert (item.kind, item.sender, item.request_id, item.payload) == ("response", "agent:coder", request.pk, answer)
    assert item.request is not None and item.request.status == "completed"
    assert kinds(team["coder"]) == [("request", request.pk)]  # nothing more for the recipient
    assert journal(team.saga, after=mark) == [("request.completed", "agent:coder")]
    [event] = events_of(team.saga, "request.completed")
    assert event.data == {
        "request_id": request.pk, "from": "agent:lead", "to": "agent:coder", "status": "completed",
        "payload": answer, "error": None,
    }  # fmt: skip


def test_a_delivered_request_can_be_answered(team: Team) -> None:
    request = ask(team)
    consume_steering(recipient=team["coder"])
    assert AgentRequest.objects.get(pk=request.pk).status == "delivered"

    assert reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"ok": 1}).status == "completed"


@pytest.mark.parametrize(
    ("error", "stored"),
    [
        ({"code": "unsupported", "message": "Python only."}, {"code": "unsupported", "message": "Python only."}),
        ("I only review Python.", {"code": "error", "message": "I only review Python."}),
        ({"message": "no code given"}, {"code": "error", "message": "no code given"}),
    ],
)  # fmt: skip
def test_an_error_reply_fails_the_request(team: Team, error: Any, stored: dict[str, str]) -> None:
    request = ask(team)
    mark = last_seq(team.saga)

    failed = reply_to_request(request_id=request.pk, by=team.user("coder"), error=error)

    assert (failed.status, failed.reply, failed.error) == ("failed", None, stored)
    [item] = steering(team["lead"])
    assert (item.kind, item.request_id) == ("response", request.pk)
    assert journal(team.saga, after=mark) == [("request.failed", "agent:coder")]
    assert events_of(team.saga, "request.failed")[0].data["error"] == stored


@pytest.mark.parametrize("arguments", [{}, {"payload": {"a": 1}, "error": "and an error"}])
def test_a_reply_is_a_payload_or_an_error(team: Team, arguments: dict[str, Any]) -> None:
    request = ask(team)

    with pytest.raises(errors.InvalidPayload):
        reply_to_request(request_id=request.pk, by=team.user("coder"), **arguments)

    assert AgentRequest.objects.get(pk=request.pk).status == "pending"


def test_an_oversized_reply_is_refused_and_the_request_stays_open(team: Team, settings: LazySettings) -> None:
    request = ask(team)
    settings.AGORA_MAX_PAYLOAD_BYTES = 100

    with pytest.raises(errors.PayloadTooLarge):
        reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"blob": "x" * 200})

    assert AgentRequest.objects.get(pk=request.pk).status == "pending"
    assert steering(team["lead"]) == []


@pytest.mark.parametrize(("who", "error"), [("lead", errors.Forbidden), ("alice", errors.Forbidden)])
def test_only_the_recipient_replies(team: Team, who: str, error: type[errors.KernelError]) -> None:
    request = ask(team)
    mark = last_seq(team.saga)

    with pytest.raises(error):
        reply_to_request(request_id=request.pk, by=team.user(who), payload={"forged": True})

    assert AgentRequest.objects.get(pk=request.pk).status == "pending"
    assert steering(team["lead"]) == []
    assert last_seq(team.saga) == mark


@pytest.mark.parametrize("who", ["bob", "mallory", "reviewer", "tester"])
def test_to_anyone_else_the_request_does_not_exist(team: Team, who: str, request: pytest.FixtureRequest) -> None:
    agent_request = ask(team)
    user: User = request.getfixturevalue(who) if who in ("bob", "mallory") else team.user(who)

    with pytest.raises(errors.NotFound):
        reply_to_request(request_id=agent_request.pk, by=user, payload={})
    with pytest.raises(errors.NotFound):
        cancel_request(request_id=agent_request.pk, by=user)
    with pytest.raises(errors.NotFound):
        reply_to_request(request_id="req-doesnotexist", by=user, payload={})


def replying(team: Team, in_turn: bool) -> AbstractContextManager[object]:
    """Where a reply is made: on its own, or (in_turn) in a transaction that already holds the
    saga's lock, as an internal agent's turn does, where the request's status is read under it."""
    return saga_transaction(team.saga) if in_turn else nullcontext()


@pytest.mark.parametrize("in_turn", [False, True])
def test_a_second_reply_is_already_answered_and_changes_nothing(team: Team, in_turn: bool) -> None:
    request = ask(team)
    with replying(team, in_turn):
        reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"first": True})
    mark = last_seq(team.saga)

    for second in ({"payload": {"second": True}}, {"error": "changed my mind"}):
        with pytest.raises(errors.AlreadyAnswered) as refused, replying(team, in_turn):
            reply_to_request(request_id=request.pk, by=team.user("coder"), **second)
        assert (refused.value.code, refused.value.status) == ("already_answered", 409)

    stored = AgentRequest.objects.get(pk=request.pk)
    assert (stored.status, stored.reply) == ("completed", {"first": True})
    assert len(steering(team["lead"])) == 1
    assert last_seq(team.saga) == mark


def test_several_requests_answered_out_of_order_are_matched_by_request_id(team: Team) -> None:
    asked = [ask(team, to=to, payload={"n": n}) for n, to in enumerate(["coder", "reviewer", "coder", "scout"])]

    for request in reversed(asked):
        recipient = request.recipient.name
        reply_to_request(request_id=request.pk, by=team.user(recipient), payload={"answer_to": request.payload["n"]})

    items = steering(team["lead"])
    assert [item.request_id for item in items] == [r.pk for r in reversed(asked)]
    assert [item.seq for item in items] == [1, 2, 3, 4]
    for item in items:
        request = AgentRequest.objects.get(pk=item.request_id)
        assert item.payload == {"answer_to": request.payload["n"]}
        assert item.sender == request.recipient.handle


def test_a_reply_resumes_a_sender_parked_on_it(
    make_team: MakeTeam, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    team = make_team(internal=["lead"])
    lead_run = claim_turn(run_id=team.run("lead").pk)
    assert lead_run is not None and lead_run.turn == 1
    request = ask(team, mode="wait", timeout_s=60)
    park_on_request(run=lead_run, turn=1, request_id=request.pk, tool_call_id="call-1")
    assert end_turn(run=lead_run, turn=1, more=False) == Run.Status.WAITING
    parked = team.run("lead")
    assert (parked.waiting_on_id, parked.wait_until) == (request.pk, request.wait_deadline)

    with django_capture_on_commit_callbacks(execute=True):
        reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"ok": True})

    resumed = team.run("lead")
    assert (resumed.status, resumed.wait_until, resumed.waiting_on_id) == ("queued", None, request.pk)
    assert queued_turns(redis_url) == [lead_run.pk]


def test_a_turn_that_ends_after_its_wait_was_answered_does_not_park(make_team: MakeTeam) -> None:
    team = make_team(internal=["lead"])
    lead_run = claim_turn(run_id=team.run("lead").pk)
    assert lead_run is not None
    request = ask(team, mode="wait")
    park_on_request(run=lead_run, turn=1, request_id=request.pk, tool_call_id="call-1")
    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"fast": True})

    assert end_turn(run=lead_run, turn=1, more=False) == Run.Status.QUEUED


# --- cancellation ------------------------------------------------------------------------------


def test_the_sender_cancels_and_the_recipient_gets_a_notice(team: Team) -> None:
    request = ask(team, mode="wait")
    mark = last_seq(team.saga)

    cancelled = cancel_request(request_id=request.pk, by=team.user("lead"))

    assert (cancelled.status, cancelled.wait_deadline) == ("cancelled", None)
    notice = steering(team["coder"])[-1]
    assert (notice.kind, notice.sender, notice.request_id, notice.payload) == (
        "notice", "agent:lead", request.pk, {"status": "cancelled"},
    )  # fmt: skip
    assert kinds(team["lead"]) == [("notice", request.pk)]
    assert journal(team.saga, after=mark) == [("request.cancelled", "agent:lead")]


def test_cancelling_twice_is_fine_and_does_nothing_more(team: Team) -> None:
    request = ask(team)
    cancel_request(request_id=request.pk, by=team.user("lead"))
    mark = last_seq(team.saga)
    before = (len(steering(team["lead"])), len(steering(team["coder"])))

    again = cancel_request(request_id=request.pk, by=team.user("lead"))

    assert again.status == "cancelled"
    assert (len(steering(team["lead"])), len(steering(team["coder"]))) == before
    assert last_seq(team.saga) == mark


@pytest.mark.parametrize("who", ["coder", "alice"])
def test_only_the_sender_cancels(team: Team, who: str) -> None:
    request = ask(team)

    with pytest.raises(errors.Forbidden):
        cancel_request(request_id=request.pk, by=team.user(who))

    assert AgentRequest.objects.get(pk=request.pk).status == "pending"


@pytest.mark.parametrize("in_turn", [False, True])
def test_a_late_reply_to_a_cancelled_request_is_refused(team: Team, in_turn: bool) -> None:
    request = ask(team)
    cancel_request(request_id=request.pk, by=team.user("lead"))
    mark = last_seq(team.saga)

    with pytest.raises(errors.RequestCancelled) as refused, replying(team, in_turn):
        reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"late": True})

    assert (refused.value.code, refused.value.status) == ("request_cancelled", 409)
    assert AgentRequest.objects.get(pk=request.pk).reply is None
    assert last_seq(team.saga) == mark


def test_cancelling_an_answered_request_is_already_answered(team: Team) -> None:
    request = ask(team)
    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={})

    with pytest.raises(errors.AlreadyAnswered):
        cancel_request(request_id=request.pk, by=team.user("lead"))

    assert AgentRequest.objects.get(pk=request.pk).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_reply_has_exactly_one_winner(team: Team) -> None:
    lead_user, coder_user = team.user("lead"), team.user("coder")
    winners = set()
    for round in range(6):
        request = ask(team, payload={"round": round})
        mark = last_seq(team.saga)

        def cancel_it(pk: str = request.pk) -> AgentRequest:
            return cancel_request(request_id=pk, by=lead_user)

        def answer_it(pk: str = request.pk, round: int = round) -> AgentRequest:
            return reply_to_request(request_id=pk, by=coder_user, payload={"round": round})

        cancel, reply = outcomes(run_concurrently(cancel_it, answer_it))

        final = AgentRequest.objects.get(pk=request.pk)
        lead_items = [i for i in steering(team["lead"]) if i.request_id == request.pk]
        coder_items = [i for i in steering(team["coder"]) if i.request_id == request.pk]
        if final.status == "completed":
            assert isinstance(reply, AgentRequest) and isinstance(cancel, errors.AlreadyAnswered), (cancel, reply)
            assert [i.kind for i in lead_items] == ["response"]
            assert [i.kind for i in coder_items] == ["request"]
        else:
            assert final.status == "cancelled"
            assert isinstance(cancel, AgentRequest) and isinstance(reply, errors.RequestCancelled), (cancel, reply)
            assert final.reply is None
            assert [i.kind for i in lead_items] == ["notice"]
            assert [i.kind for i in coder_items] == ["request", "notice"]
        assert journal(team.saga, after=mark) == [
            (f"request.{final.status}", "agent:coder" if final.status == "completed" else "agent:lead")
        ]
        winners.add(final.status)
    assert winners <= {"completed", "cancelled"}


# --- finished runs -----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.SHUTDOWN])
def test_finishing_a_run_makes_its_open_requests_recipient_unavailable(team: Team, status: str) -> None:
    delivered = ask(team, sender="lead")
    consume_steering(recipient=team["coder"])
    pending = ask(team, sender="reviewer")
    answered = ask(team, sender="tester")
    reply_to_request(request_id=answered.pk, by=team.user("coder"), payload={"done": True})
    outbound = ask(team, sender="coder", to="tester", mode="wait")
    mark = last_seq(team.saga)

    assert finish_run(run=team.run("coder"), status=status, result={"summary": "bye"})

    stranded = {r.pk: r for r in AgentRequest.objects.filter(pk__in=[delivered.pk, pending.pk])}
    assert {r.status for r in stranded.values()} == {"recipient_unavailable"}
    why = {"code": "recipient_unavailable", "message": f"agent:coder ended ({status}) before replying."}
    assert [r.error for r in stranded.values()] == [why, why]
    assert AgentRequest.objects.get(pk=answered.pk).status == "completed"
    still_out = AgentRequest.objects.get(pk=outbound.pk)
    assert (still_out.status, still_out.wait_deadline) == ("pending", None)  # it no longer waits on anyone
    for sender, request in (("lead", delivered), ("reviewer", pending)):
        [notice] = [i for i in steering(team[sender]) if i.request_id == request.pk]
        assert (notice.kind, notice.sender) == ("notice", "agent:coder")
        assert notice.request is not None and notice.request.status == "recipient_unavailable"
    run = team.run("coder")
    assert (run.status, run.result, run.lease_until) == (status, {"summary": "bye"}, None)
    assert journal(team.saga, after=mark) == [
        ("request.recipient_unavailable", "agent:coder"),
        ("request.recipient_unavailable", "agent:coder"),
        (f"run.{status}", "agent:coder"),
    ]
    expected_delegation = {"completed": "completed", "failed": "failed"}.get(status, "cancelled")
    assert Delegation.objects.get(delegate=team["coder"]).status == expected_delegation


def test_a_second_finish_is_a_no_op(team: Team) -> None:
    ask(team)
    assert finish_run(run=team.run("coder"), status=Run.Status.COMPLETED)
    mark = last_seq(team.saga)
    items = SteeringItem.objects.count()

    assert not finish_run(run=team.run("coder"), status=Run.Status.FAILED, error="again")

    assert team.run("coder").status == Run.Status.COMPLETED
    assert (last_seq(team.saga), SteeringItem.objects.count()) == (mark, items)


def test_finish_run_refuses_a_status_that_is_not_terminal(team: Team) -> None:
    with pytest.raises(errors.InvalidPayload):
        finish_run(run=team.run("coder"), status=Run.Status.IDLE)

    assert team.run("coder").status == Run.Status.IDLE


def test_finishing_resumes_senders_parked_on_the_finished_recipient(make_team: MakeTeam) -> None:
    team = make_team(internal=["lead"])
    lead_run = claim_turn(run_id=team.run("lead").pk)
    assert lead_run is not None
    request = ask(team, mode="wait")
    park_on_request(run=lead_run, turn=1, request_id=request.pk, tool_call_id="call-1")
    end_turn(run=lead_run, turn=1, more=False)

    finish_run(run=team.run("coder"), status=Run.Status.FAILED, error="crashed")

    assert team.run("lead").status == Run.Status.QUEUED
    assert AgentRequest.objects.get(pk=request.pk).status == "recipient_unavailable"


# --- external runs report their status ---------------------------------------------------------


def test_an_external_agent_reports_working_idle_and_finished(team: Team) -> None:
    request = ask(team)
    coder, run_id = team.user("coder"), team.run("coder").pk
    mark = last_seq(team.saga)

    assert set_external_status(run_id=run_id, status="working", by=coder).status == Run.Status.RUNNING
    assert set_external_status(run_id=run_id, status="working", by=coder).status == Run.Status.RUNNING
    assert set_external_status(run_id=run_id, status="idle", by=coder).status == Run.Status.IDLE
    assert set_external_status(run_id=run_id, status="finished", by=coder).status == Run.Status.COMPLETED

    assert AgentRequest.objects.get(pk=request.pk).status == "recipient_unavailable"
    assert journal(team.saga, after=mark) == [
        ("run.running", "agent:coder"),  # reporting the same status twice records it once
        ("run.idle", "agent:coder"),
        ("request.recipient_unavailable", "agent:coder"),
        ("run.completed", "agent:coder"),
    ]
    with pytest.raises(errors.InvalidState):
        set_external_status(run_id=run_id, status="working", by=coder)


def test_a_finished_resumable_external_agent_may_report_working_again(make_team: MakeTeam) -> None:
    team = make_team(resumable=["coder"])
    run_id = team.run("coder").pk
    set_external_status(run_id=run_id, status="finished", by=team.user("coder"))

    assert set_external_status(run_id=run_id, status="working", by=team.user("coder")).status == Run.Status.RUNNING


def test_only_the_agent_itself_reports_its_status(team: Team, alice: User) -> None:
    run_id = team.run("coder").pk
    for user in (alice, team.user("lead")):
        with pytest.raises(errors.NotFound):
            set_external_status(run_id=run_id, status="finished", by=user)
    with pytest.raises(errors.InvalidPayload):
        set_external_status(run_id=run_id, status="sleeping", by=team.user("coder"))

    assert team.run("coder").status == Run.Status.IDLE


def test_an_internal_agent_does_not_report_its_own_status(make_team: MakeTeam) -> None:
    team = make_team(internal=["coder"])

    with pytest.raises(errors.Forbidden):
        set_external_status(run_id=team.run("coder").pk, status="idle", by=team.user("coder"))


def test_steering_messages_do_not_count_as_request_outcomes(team: Team, alice: User) -> None:
    request = ask(team)
    steer(saga=team.saga, to=team["coder"], message="hurry up", by=alice)
    finish_run(run=team.run("coder"), status=Run.Status.COMPLETED)

    assert [i.kind for i in steering(team["coder"])] == ["request", "message"]
    assert [(i.kind, i.request_id) for i in steering(team["lead"])] == [("notice", request.pk)]
