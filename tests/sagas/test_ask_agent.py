"""`ask_agent`: durable requests, their validation and limits, idempotency, wait cycles, and
finished recipients."""

from datetime import timedelta
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import User
from journal.models import JournalEvent
from sagas import errors
from sagas.actions import add_agent, ask_agent, end_wait, finish_run, reply_to_request, saga_transaction
from sagas.actions.requests import _ASK_SQL
from sagas.models import AgentRequest, Run, Saga, SteeringItem
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import (
    Clock,
    Team,
    events_of,
    field_errors,
    forget_queued_turns,
    journal,
    last_seq,
    outcomes,
    queued_turns,
    reads,
    request_ids,
    run_concurrently,
    steering,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def nothing_stored(team: Team, mark: int) -> None:
    assert not AgentRequest.objects.filter(saga=team.saga).exists()
    assert not SteeringItem.objects.filter(recipient__saga=team.saga).exists()
    assert last_seq(team.saga) == mark


# --- the request and its delivery --------------------------------------------------------------


def test_async_ask_stores_the_request_one_steering_item_and_one_journal_event(
    team: Team, clock: Clock, settings: LazySettings
) -> None:
    mark = last_seq(team.saga)
    payload = {"api_change": "drop /v1/users", "refs": ["artifact:spec#3"], "n": 3, "nested": {"ok": True}}

    request, created = ask_agent(sender=team["lead"], to="agent:coder", type="compatibility.check", payload=payload)

    assert created
    request.refresh_from_db()
    assert request.pk.startswith("req-")
    assert (request.sender, request.recipient) == (team["lead"], team["coder"])
    assert (request.type, request.payload, request.mode) == ("compatibility.check", payload, "async")
    assert (request.status, request.hop, request.wait_deadline) == ("pending", 1, None)
    assert request.expires_at == clock.now + timedelta(seconds=settings.AGORA_REQUEST_TTL_S)
    [item] = steering(team["coder"])
    assert (item.seq, item.kind, item.sender, item.request_id, item.payload) == (
        1, "request", "agent:lead", request.pk, payload,
    )  # fmt: skip
    assert item.consumed_at is None
    assert steering(team["lead"]) == []  # the sender carries on: nothing waits for it
    assert journal(team.saga, after=mark) == [("request.created", "agent:lead")]
    [event] = events_of(team.saga, "request.created")
    assert event.run_id == team.run("lead").pk
    assert event.data == {
        "request_id": request.pk, "to": "agent:coder", "type": "compatibility.check", "mode": "async", "hop": 1,
        "payload": payload,
    }  # fmt: skip


def test_an_idle_external_recipient_is_not_restarted_by_a_request(team: Team) -> None:
    ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})

    assert team.run("coder").status == Run.Status.IDLE


# A real commit: on PostgreSQL the run to ring comes back with the COMMIT, before its hooks run.
@pytest.mark.django_db(transaction=True)
def test_an_idle_internal_recipient_is_queued_and_rung_after_commit(make_team: MakeTeam, redis_url: str) -> None:
    team = make_team(internal=["coder"])
    coder_run = team.run("coder")
    Run.objects.filter(pk=coder_run.pk).update(status=Run.Status.IDLE)  # its first turn is over
    forget_queued_turns(redis_url)

    with transaction.atomic():
        ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})
        assert queued_turns(redis_url) == []

    assert team.run("coder").status == Run.Status.QUEUED
    assert queued_turns(redis_url) == [coder_run.pk]


def test_a_wait_sets_a_deadline_bounded_by_the_maximum(team: Team, clock: Clock, settings: LazySettings) -> None:
    settings.AGORA_MAX_WAIT_S = 120
    short, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={}, mode="wait", timeout_s=30)
    long, _ = ask_agent(sender=team["lead"], to="agent:reviewer", type="ping", payload={}, mode="wait", timeout_s=9999)
    default, _ = ask_agent(sender=team["coder"], to="agent:tester", type="ping", payload={}, mode="wait")

    assert short.wait_deadline == clock.now + timedelta(seconds=30)
    assert long.wait_deadline == clock.now + timedelta(seconds=120)
    assert default.wait_deadline == clock.now + timedelta(seconds=min(settings.AGORA_DEFAULT_WAIT_S, 120))
    assert short.mode == "wait" and short.status == "pending"


def test_only_agents_ask_agents(team: Team) -> None:
    with pytest.raises(errors.Forbidden):
        ask_agent(sender=team["alice"], to="agent:lead", type="ping", payload={})


def test_an_agent_cannot_ask_itself(team: Team) -> None:
    with pytest.raises(errors.InvalidPayload):
        ask_agent(sender=team["lead"], to="agent:lead", type="ping", payload={})


@pytest.mark.parametrize("bad_type", ["", "has space", "1st", "a..b", "trailing.", ".lead", "x" * 101, 42, None])
def test_request_types_are_short_dotted_names(team: Team, bad_type: Any) -> None:
    mark = last_seq(team.saga)

    with pytest.raises(errors.InvalidPayload) as refused:
        ask_agent(sender=team["lead"], to="agent:coder", type=bad_type, payload={})

    assert set(field_errors(refused)) == {"type"}
    nothing_stored(team, mark)


@pytest.mark.parametrize("good_type", ["ping", "code.review", "compatibility.check-v2", "A.b_c.D9"])
def test_valid_request_types_are_accepted(team: Team, good_type: str) -> None:
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type=good_type, payload={})

    assert AgentRequest.objects.get(pk=request.pk).type == good_type


@pytest.mark.parametrize(("options", "field"), [({"mode": "later"}, "mode"), ({"timeout_s": -5}, "timeout_s")])
def test_bad_mode_or_timeout_is_refused(team: Team, options: dict[str, Any], field: str) -> None:
    mark = last_seq(team.saga)

    with pytest.raises(errors.InvalidPayload) as refused:
        ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={}, **options)

    assert field in field_errors(refused)
    nothing_stored(team, mark)


@pytest.mark.parametrize("payload", ["plain text", 42, False, [1, "two", {"three": 3.0}], {"ключ": "значение ✓"}])
def test_payloads_are_any_json(team: Team, payload: Any) -> None:
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload=payload)

    assert AgentRequest.objects.get(pk=request.pk).payload == payload
    assert steering(team["coder"])[0].payload == payload


def test_a_missing_payload_is_invalid_not_a_database_error(team: Team) -> None:
    mark = last_seq(team.saga)

    with pytest.raises(errors.InvalidPayload) as refused:
        ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload=None)

    assert set(field_errors(refused)) == {"payload"}
    nothing_stored(team, mark)


def test_a_payload_over_the_limit_is_refused_with_nothing_stored(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_PAYLOAD_BYTES = 1024
    mark = last_seq(team.saga)

    with pytest.raises(errors.PayloadTooLarge) as refused:
        ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={"blob": "x" * 1024})

    assert (refused.value.code, refused.value.status) == ("payload_too_large", 413)
    nothing_stored(team, mark)
    # The limit counts the compact UTF-8 JSON: a string of exactly the limit fits, one byte more does not.
    ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload="é" * 511)  # 2 quotes + 1022 bytes
    with pytest.raises(errors.PayloadTooLarge):
        ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload="é" * 511 + "x")
    assert AgentRequest.objects.filter(saga=team.saga).count() == 1


# --- idempotency -------------------------------------------------------------------------------


def test_the_same_key_and_body_return_the_first_request(team: Team) -> None:
    first, created = ask_agent(
        sender=team["lead"], to="agent:coder", type="ping", payload={"a": 1}, idempotency_key="k1"
    )
    mark = last_seq(team.saga)

    again, created_again = ask_agent(
        sender=team["lead"], to="agent:coder", type="ping", payload={"a": 1}, idempotency_key="k1"
    )

    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert request_ids(team.saga) == [first.pk]
    assert len(steering(team["coder"])) == 1
    assert last_seq(team.saga) == mark


def test_a_replay_after_the_reply_still_returns_the_first_request(team: Team) -> None:
    first, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={}, idempotency_key="k1")
    reply_to_request(request_id=first.pk, by=team.user("coder"), payload={"pong": True})

    again, created = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={}, idempotency_key="k1")

    assert (again.pk, created, again.status) == (first.pk, False, "completed")
    assert len(steering(team["coder"])) == 1


@pytest.mark.parametrize(
    "change",
    [{"payload": {"a": 2}}, {"type": "pong"}, {"to": "agent:reviewer"}, {"mode": "wait"}],
)
def test_the_same_key_with_another_body_is_a_conflict(team: Team, change: dict[str, Any]) -> None:
    body: dict[str, Any] = {"to": "agent:coder", "type": "ping", "payload": {"a": 1}, "mode": "async"}
    first, _ = ask_agent(sender=team["lead"], idempotency_key="k1", **body)
    mark = last_seq(team.saga)

    with pytest.raises(errors.IdempotencyConflict):
        ask_agent(sender=team["lead"], idempotency_key="k1", **{**body, **change})

    assert request_ids(team.saga) == [first.pk]
    assert last_seq(team.saga) == mark


def test_idempotency_keys_belong_to_their_sender(team: Team) -> None:
    mine, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={}, idempotency_key="k1")
    theirs, created = ask_agent(sender=team["tester"], to="agent:coder", type="ping", payload={}, idempotency_key="k1")

    assert created and theirs.pk != mine.pk


@pytest.mark.django_db(transaction=True)
def test_the_same_key_eight_times_at_once_makes_one_request_and_one_steering_item(team: Team) -> None:
    lead = team["lead"]

    def ask() -> tuple[AgentRequest, bool]:
        return ask_agent(sender=lead, to="agent:coder", type="ping", payload={"n": 1}, idempotency_key="tool-call-7")

    results = outcomes(run_concurrently(*[ask] * 8))

    assert all(isinstance(r, tuple) for r in results), results
    assert len({request.pk for request, _ in results}) == 1
    assert sorted(created for _, created in results) == [False] * 7 + [True]
    assert AgentRequest.objects.filter(saga=team.saga).count() == 1
    assert len(steering(team["coder"])) == 1
    assert len(events_of(team.saga, "request.created")) == 1


# --- limits ------------------------------------------------------------------------------------


def test_the_hop_limit_stops_a_chain_of_asks(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_HOPS = 2
    add_agent(saga=team.saga, name="helper", role="", task="", runtime="external", by=team.user("tester"))
    first, _ = ask_agent(sender=team["lead"], to="agent:coder", type="step", payload={})
    second, _ = ask_agent(sender=team["coder"], to="agent:tester", type="step", payload={})
    mark = last_seq(team.saga)

    with pytest.raises(errors.HopLimit) as refused:
        ask_agent(sender=team["tester"], to="agent:helper", type="step", payload={})

    assert (first.hop, second.hop) == (1, 2)
    assert refused.value.code == "hop_limit"
    assert request_ids(team.saga) == [first.pk, second.pk]
    assert last_seq(team.saga) == mark
    # Hops count open inbound requests only: once tester has answered, its next ask starts afresh.
    reply_to_request(request_id=second.pk, by=team.user("tester"), payload={})
    third, _ = ask_agent(sender=team["tester"], to="agent:helper", type="step", payload={})
    assert third.hop == 1


def test_the_hop_is_one_more_than_the_deepest_open_inbound_request(team: Team) -> None:
    ask_agent(sender=team["lead"], to="agent:coder", type="step", payload={})  # hop 1 into coder
    deep, _ = ask_agent(sender=team["lead"], to="agent:reviewer", type="step", payload={})
    from_reviewer, _ = ask_agent(sender=team["reviewer"], to="agent:coder", type="step", payload={})  # hop 2

    onward, _ = ask_agent(sender=team["coder"], to="agent:tester", type="step", payload={})

    assert (deep.hop, from_reviewer.hop, onward.hop) == (1, 2, 3)


def test_the_pending_cap_is_per_sender_and_frees_up_when_answered(team: Team, settings: LazySettings) -> None:
    settings.AGORA_MAX_PENDING_PER_SENDER = 2
    first, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})
    ask_agent(sender=team["lead"], to="agent:reviewer", type="ping", payload={})
    mark = last_seq(team.saga)

    with pytest.raises(errors.TooManyPending) as refused:
        ask_agent(sender=team["lead"], to="agent:scout", type="ping", payload={})

    assert (refused.value.code, refused.value.status) == ("too_many_pending", 429)
    assert AgentRequest.objects.filter(sender=team["lead"]).count() == 2
    assert last_seq(team.saga) == mark
    ask_agent(sender=team["coder"], to="agent:tester", type="ping", payload={})  # another sender is not capped
    reply_to_request(request_id=first.pk, by=team.user("coder"), payload={})
    ask_agent(sender=team["lead"], to="agent:scout", type="ping", payload={})
    assert AgentRequest.objects.filter(sender=team["lead"]).count() == 3


# --- what an ask reads ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("to", "limit", "refusal"),
    [
        ("agent:coder", "", None),
        ("agent:nobody", "", errors.NotFound),
        ("human:bob", "", errors.InvalidPayload),  # a person is asked with ask_human
        ("agent:lead", "", errors.InvalidPayload),  # itself
        ("agent:reviewer", "", errors.RecipientUnavailable),
        ("agent:coder", "AGORA_MAX_PENDING_PER_SENDER", errors.TooManyPending),
        ("agent:coder", "AGORA_MAX_HOPS", errors.HopLimit),
        ("agent:coder", "AGORA_MAX_STEERING_BACKLOG", errors.TooManyPending),
    ],
)
def test_in_a_turn_an_ask_reads_once_whatever_it_decides(
    team: Team, settings: LazySettings, to: str, limit: str, refusal: type[errors.KernelError] | None
) -> None:
    """In a turn's transaction (the saga's lock held, its copy current) the recipient and its run,
    the address grant, the three limits and the saga's status come in one statement."""
    finish_run(run=team.run("reviewer"), status=Run.Status.COMPLETED)
    if limit:
        setattr(settings, limit, 0)
    lead = team["lead"]
    with CaptureQueriesContext(connection) as captured, saga_transaction(lead.saga, current=True):
        if refusal is None:
            ask_agent(sender=lead, to=to, type="ping", payload={})
        else:
            with pytest.raises(refusal):
                ask_agent(sender=lead, to=to, type="ping", payload={})

    [read] = reads(captured)
    assert read.startswith(_ASK_SQL.split("%s")[0])


def test_a_refusal_to_address_reads_the_tree_to_tell_it_from_one_not_found(make_team: MakeTeam) -> None:
    team = make_team(policy=Saga.Policy.HUB)
    coder = team["coder"]
    with CaptureQueriesContext(connection) as captured, saga_transaction(coder.saga, current=True):
        with pytest.raises(errors.NotAddressable):
            ask_agent(sender=coder, to="agent:tester", type="ping", payload={})  # its delegate
        with pytest.raises(errors.NotFound):
            ask_agent(sender=coder, to="agent:reviewer", type="ping", payload={})  # a sibling, unseen under hub

    statements = reads(captured)
    assert len(statements) == 4  # per ask: its one statement, then the saga's tree
    assert all(s.startswith(_ASK_SQL.split("%s")[0]) for s in statements[::2])


# --- wait cycles -------------------------------------------------------------------------------


def test_a_wait_that_closes_a_two_agent_cycle_is_a_deadlock_naming_it(team: Team) -> None:
    lead_waits, _ = ask_agent(sender=team["lead"], to="agent:coder", type="review", payload={}, mode="wait")
    mark = last_seq(team.saga)

    with pytest.raises(errors.Deadlock) as refused:
        ask_agent(sender=team["coder"], to="agent:lead", type="clarify", payload={}, mode="wait")

    assert refused.value.code == "deadlock"
    assert refused.value.extra["cycle"] == ["agent:coder", "agent:lead", "agent:coder"]
    assert lead_waits.pk in refused.value.detail
    assert request_ids(team.saga) == [lead_waits.pk]
    assert last_seq(team.saga) == mark


def test_a_longer_cycle_is_found_too(make_team: MakeTeam) -> None:
    team = make_team(policy=Saga.Policy.OPEN)  # so that tester may address lead directly
    ask_agent(sender=team["lead"], to="agent:coder", type="a", payload={}, mode="wait")
    ask_agent(sender=team["coder"], to="agent:tester", type="b", payload={}, mode="wait")

    with pytest.raises(errors.Deadlock) as refused:
        ask_agent(sender=team["tester"], to="agent:lead", type="c", payload={}, mode="wait")

    assert refused.value.extra["cycle"] == ["agent:tester", "agent:lead", "agent:coder", "agent:tester"]
    assert AgentRequest.objects.filter(saga=team.saga).count() == 2


def test_async_asks_never_deadlock(team: Team) -> None:
    ask_agent(sender=team["lead"], to="agent:coder", type="review", payload={}, mode="wait")

    back, created = ask_agent(sender=team["coder"], to="agent:lead", type="clarify", payload={})

    assert created and back.mode == "async"
    # ...and an async edge does not count against a later wait either.
    ask_agent(sender=team["reviewer"], to="agent:lead", type="x", payload={})
    ask_agent(sender=team["lead"], to="agent:reviewer", type="y", payload={}, mode="wait")


def test_a_wait_whose_deadline_passed_no_longer_counts(team: Team, clock: Clock) -> None:
    ask_agent(sender=team["lead"], to="agent:coder", type="review", payload={}, mode="wait", timeout_s=30)
    clock.advance(31)  # the reconciler has not run yet: the deadline alone takes the edge out

    back, created = ask_agent(sender=team["coder"], to="agent:lead", type="clarify", payload={}, mode="wait")

    assert created and back.wait_deadline is not None


def test_an_ended_wait_no_longer_counts(team: Team) -> None:
    lead_waits, _ = ask_agent(sender=team["lead"], to="agent:coder", type="review", payload={}, mode="wait")
    assert end_wait(request_id=lead_waits.pk)

    _, created = ask_agent(sender=team["coder"], to="agent:lead", type="clarify", payload={}, mode="wait")

    assert created
    assert AgentRequest.objects.get(pk=lead_waits.pk).status == "pending"  # the request itself lives on


def test_an_answered_wait_no_longer_counts(team: Team) -> None:
    lead_waits, _ = ask_agent(sender=team["lead"], to="agent:coder", type="review", payload={}, mode="wait")
    reply_to_request(request_id=lead_waits.pk, by=team.user("coder"), payload={})

    _, created = ask_agent(sender=team["coder"], to="agent:lead", type="clarify", payload={}, mode="wait")

    assert created


@pytest.mark.django_db(transaction=True)
def test_two_waits_closing_a_cycle_at_the_same_instant_cannot_both_pass(team: Team) -> None:
    lead, coder = team["lead"], team["coder"]

    results = outcomes(
        run_concurrently(
            lambda: ask_agent(sender=lead, to="agent:coder", type="a", payload={}, mode="wait"),
            lambda: ask_agent(sender=coder, to="agent:lead", type="b", payload={}, mode="wait"),
        )
    )

    assert sorted(type(r).__name__ for r in results) == ["Deadlock", "tuple"], results
    assert AgentRequest.objects.filter(saga=team.saga).count() == 1


# --- finished recipients -----------------------------------------------------------------------


@pytest.mark.parametrize("status", [Run.Status.COMPLETED, Run.Status.FAILED, Run.Status.SHUTDOWN])
def test_a_finished_recipient_that_cannot_resume_is_unavailable_at_once(team: Team, status: str) -> None:
    finish_run(run=team.run("coder"), status=status)
    mark = last_seq(team.saga)

    with pytest.raises(errors.RecipientUnavailable) as refused:
        ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})

    assert (refused.value.code, refused.value.status) == ("recipient_unavailable", 409)
    assert not AgentRequest.objects.filter(saga=team.saga).exists()
    assert last_seq(team.saga) == mark


def test_a_finished_resumable_external_agent_accepts_and_its_run_comes_back_idle(make_team: MakeTeam) -> None:
    team = make_team(resumable=["coder"])
    finish_run(run=team.run("coder"), status=Run.Status.COMPLETED)
    mark = last_seq(team.saga)

    request, created = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})

    assert created and request.status == "pending"
    assert team.run("coder").status == Run.Status.IDLE
    assert [item.request_id for item in steering(team["coder"])] == [request.pk]
    assert journal(team.saga, after=mark) == [("request.created", "agent:lead"), ("run.resumed", "agent:lead")]


@pytest.mark.django_db(transaction=True)
def test_a_finished_resumable_internal_agent_is_queued_and_rung(make_team: MakeTeam, redis_url: str) -> None:
    team = make_team(internal=["coder"], resumable=["coder"])
    coder_run = team.run("coder")
    finish_run(run=coder_run, status=Run.Status.COMPLETED)
    forget_queued_turns(redis_url)

    ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})

    assert team.run("coder").status == Run.Status.QUEUED
    assert queued_turns(redis_url) == [coder_run.pk]
    [resumed] = events_of(team.saga, "run.resumed")
    assert (resumed.actor, resumed.run_id) == ("agent:lead", coder_run.pk)


def test_request_events_name_their_actor_in_order(team: Team, bob: User) -> None:
    """One conversation, and the journal tells it: who asked, who answered, in that order."""
    mark = last_seq(team.saga)
    question, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={})
    onward, _ = ask_agent(sender=team["coder"], to="agent:tester", type="ping", payload={})
    reply_to_request(request_id=onward.pk, by=team.user("tester"), payload={})
    reply_to_request(request_id=question.pk, by=team.user("coder"), payload={})

    assert journal(team.saga, after=mark) == [
        ("request.created", "agent:lead"),
        ("request.created", "agent:coder"),
        ("request.completed", "agent:tester"),
        ("request.completed", "agent:coder"),
    ]
    created = JournalEvent.objects.filter(saga=team.saga, seq__gt=mark).order_by("seq")
    assert [e.data["request_id"] for e in created] == [question.pk, onward.pk, onward.pk, question.pk]
    assert timezone.is_aware(created[0].created_at)
