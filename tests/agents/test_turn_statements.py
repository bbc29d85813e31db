"""What one task of an agent's turns costs the database, counted: the statements it runs and, on
PostgreSQL, its round trips to the server (libpq's protocol trace, each ending with the server's
ReadyForQuery). A change that adds a statement to every task fails here, not in a benchmark."""

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg import pq

from accounts.models import User
from agents import scripted, transcripts
from agents.executor import run_one, run_turn
from agents.models import AgentProfile, TranscriptEntry
from agents.turns import Turns
from journal.models import JournalEvent
from sagas import actions
from sagas.models import AgentRequest, Collaborator, Run, Saga, SteeringItem
from tests.sagas.kernel import written_out

pytestmark = pytest.mark.django_db(transaction=True)

# Statements run through a cursor (on PostgreSQL, not counting what rides with them: BEGIN, the
# savepoints and the deferred statements, the journal's included), and round trips to PostgreSQL,
# of a task that takes one request, replies to it and goes idle: three turns of an agent that ran
# its first turn in this process. On SQLite the claim first reads whether the run is queued, outside
# any transaction (a doorbell that comes after its run was taken takes no write lock).
STATEMENTS = {"sqlite": 31, "postgresql": 8}
ROUND_TRIPS = 5


@pytest.fixture
def saga(alice: User) -> Saga:
    AgentProfile.objects.create(name="echo", role="Echo", model="scripted:responder", tools=["reply", "finish"])
    return actions.create_saga(title="Counted", owner=alice)


def add(saga: Saga, alice: User, name: str, *, runtime: str, profile: str = "") -> Collaborator:
    collaborator, _ = actions.add_agent(
        saga=saga, name=name, role=name.title(), task="Answer", runtime=runtime, profile=profile, by=alice
    )
    return collaborator


def ping(asker: Collaborator, n: int) -> AgentRequest:
    request, _ = actions.ask_agent(sender=asker, to="agent:echo", type="ping", payload={"n": n})
    return request


def asked(saga: Saga, alice: User) -> tuple[Collaborator, Collaborator, AgentRequest]:
    """echo, idle after its first turn (the handoff) in this process, and asker, whose ping waits
    in echo's steering."""
    echo = add(saga, alice, "echo", runtime="internal", profile="echo")
    asker = add(saga, alice, "asker", runtime="external")
    run_turn(echo.run.pk)  # its first turn: the handoff, then idle
    return echo, asker, ping(asker, 1)


@contextmanager
def round_trips() -> Iterator[Callable[[], int]]:
    """The round trips to PostgreSQL meanwhile; 0 elsewhere."""
    counted: list[int] = [0]
    if connection.vendor != "postgresql":
        yield lambda: counted[0]
        return
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield lambda: counted[0]
        finally:
            pgconn.untrace()
            trace.seek(0)
            lines = trace.read().decode(errors="replace").splitlines()
            counted[0] = sum(1 for line in lines if line.startswith("B\t") and "\tReadyForQuery\t" in line)


def test_a_task_that_answers_a_request_costs_what_it_did(saga: Saga, alice: User) -> None:
    echo, _, _ = asked(saga, alice)

    with CaptureQueriesContext(connection) as queries, round_trips() as trips:
        run_turn(echo.run.pk)

    run = Run.objects.get(pk=echo.run.pk)
    assert (run.status, run.turn) == (Run.Status.IDLE, 3)
    sent = [written_out(q["sql"]) for q in queries.captured_queries]
    listing = "\n".join(s[:160] for s in sent)
    # The task reads the run and its profile once, with its claim; the turn's end reads the
    # steering in the statement that moves the run to rest.
    assert sum("agents_agentprofile" in s for s in sent) == 1, listing
    assert not any(s.startswith("SELECT 1 FROM sagas_steeringitem") for s in sent), listing
    # The transcript this process kept from the first task is whole: nothing of it is read again.
    assert not any("SELECT seq, message, tokens FROM agents_transcriptentry" in s for s in sent), listing
    assert len(sent) == STATEMENTS[connection.vendor], listing
    if connection.vendor == "postgresql":
        assert trips() == ROUND_TRIPS


def test_a_task_reads_the_transcript_when_another_process_ran_the_last_turn(saga: Saga, alice: User) -> None:
    echo, _, _ = asked(saga, alice)
    # As if another worker had run it: its turn has moved on since this process kept its transcript.
    Run.objects.filter(pk=echo.run.pk).update(turn=5)

    with CaptureQueriesContext(connection) as queries:
        run_turn(echo.run.pk)

    sent = [written_out(q["sql"]) for q in queries.captured_queries]
    assert any("SELECT seq, message, tokens FROM agents_transcriptentry" in s for s in sent)
    transcript = Run.objects.get(pk=echo.run.pk).transcript.order_by("seq")
    assert [entry.seq for entry in transcript] == list(range(1, len(transcript) + 1))  # appended, not rewritten


def test_a_new_runs_first_task_reads_no_transcript(saga: Saga, alice: User) -> None:
    echo = add(saga, alice, "echo", runtime="internal", profile="echo")

    with CaptureQueriesContext(connection) as queries:
        run_turn(echo.run.pk)  # its first turn: the handoff, then idle

    # Nothing waits for a transcript: on PostgreSQL, where the claim cannot know yet that the run
    # is new, an empty one is read in the claim's message.
    sent = [written_out(q["sql"]) for q in queries.captured_queries]
    assert not any(s.startswith("SELECT seq, message, tokens FROM agents_transcriptentry") for s in sent)
    # Its next task, in a process that did not keep the transcript, reads it and appends after it;
    # on PostgreSQL with its claim, in the same message: no round trip more than with a kept copy.
    transcripts._kept.clear()
    actions.ask_agent(sender=add(saga, alice, "asker", runtime="external"), to="agent:echo", type="ping", payload={})
    with round_trips() as trips:
        run_turn(echo.run.pk)
    if connection.vendor == "postgresql":
        assert trips() == ROUND_TRIPS
    entries = Run.objects.get(pk=echo.run.pk).transcript.order_by("seq")
    assert [entry.turn for entry in entries][:1] == [1] and max(entry.turn for entry in entries) == 3
    assert [entry.seq for entry in entries] == list(range(1, len(entries) + 1))


def test_a_run_whose_profile_is_gone_fails_at_its_turn(saga: Saga, alice: User) -> None:
    echo = add(saga, alice, "echo", runtime="internal", profile="echo")
    AgentProfile.objects.filter(name="echo").delete()

    run_turn(echo.run.pk)

    run = Run.objects.get(pk=echo.run.pk)
    assert (run.status, run.error) == (Run.Status.FAILED, "No agent profile 'echo'.")


def test_a_turn_that_comes_to_rest_with_a_request_just_in_takes_it_in_its_next_turn_in_this_task(
    saga: Saga, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    echo, asker, first = asked(saga, alice)
    call_models = Turns.call_models
    late: list[AgentRequest] = []

    def with_a_request_during_the_last_call(turns: Turns, messages: Any) -> Any:
        answer = call_models(turns, messages)
        completion, _ = answer
        if not late and completion is not None and not completion.tool_calls:  # after the reply: it will rest
            late.append(ping(asker, 2))
        return answer

    monkeypatch.setattr(Turns, "call_models", with_a_request_during_the_last_call)
    rested = JournalEvent.objects.filter(saga=saga, run_id=echo.run.pk, type="run.idle")
    before = rested.count()

    run_turn(echo.run.pk)

    # The turn that would have rested found the request unread: the run stayed with this task, whose
    # next turn (begun after that commit) answered it; only the last turn's rest is journaled.
    assert [AgentRequest.objects.get(pk=r.pk).status for r in (first, *late)] == ["completed", "completed"]
    run = Run.objects.get(pk=echo.run.pk)
    assert (run.status, run.turn) == (Run.Status.IDLE, 5)
    assert rested.count() == before + 1
    last = rested.order_by("-seq").first()
    assert last is not None and last.data["turn"] == 5


def test_a_turn_taken_over_during_its_model_call_writes_nothing_of_what_followed(
    saga: Saga, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    echo, asker, request = asked(saga, alice)
    call_models = Turns.call_models

    def taken_over(turns: Turns, messages: Any) -> Any:
        answer = call_models(turns, messages)
        # Meanwhile the lease lapsed and the reconciler gave the turn back to the queue.
        assert actions.reclaim_lapsed_turn(
            run_id=turns.run.pk, now=timezone.now() + timedelta(hours=1), mark=timezone.now()
        )
        return answer

    monkeypatch.setattr(Turns, "call_models", taken_over)

    run_turn(echo.run.pk)  # the reply it would have sent rides after a renewal that finds no turn

    run = Run.objects.get(pk=echo.run.pk)
    assert (run.status, run.turn) == (Run.Status.QUEUED, 2)  # as the reclaim left it
    assert AgentRequest.objects.get(pk=request.pk).status == AgentRequest.Status.DELIVERED
    assert not SteeringItem.objects.filter(recipient=asker).exists()
    assert not JournalEvent.objects.filter(saga=saga, run_id=echo.run.pk, type="llm_call", data__turn=2).exists()
    assert not JournalEvent.objects.filter(saga=saga, type="request.completed").exists()
    # Of turn 2 only its input (the request, committed with the claim); not the model's message.
    entries = TranscriptEntry.objects.filter(run_id=echo.run.pk, turn=2)
    assert [entry.message["role"] for entry in entries] == ["user"]


def test_a_task_whose_run_another_worker_claimed_writes_nothing(saga: Saga, alice: User) -> None:
    echo, _, request = asked(saga, alice)
    # Its doorbell rang twice: another worker claimed the run first.
    assert actions.claim_turn(run_id=echo.run.pk, worker="other@host") is not None
    events = JournalEvent.objects.filter(saga=saga).count()

    with round_trips() as trips:
        run_turn(echo.run.pk, worker="late@host")

    # Its claim and its read of the run went in one message; finding the run taken, it rolled back.
    claimed = Run.objects.filter(pk=echo.run.pk).values_list("status", "turn", "worker").get()
    assert claimed == (Run.Status.RUNNING, 2, "other@host")
    assert AgentRequest.objects.get(pk=request.pk).status == AgentRequest.Status.PENDING
    assert SteeringItem.objects.get(recipient=echo, request=request).consumed_at is None
    assert JournalEvent.objects.filter(saga=saga).count() == events
    assert not TranscriptEntry.objects.filter(run_id=echo.run.pk, turn=2).exists()
    if connection.vendor == "postgresql":
        assert trips() == 2  # the claim with the read, then the ROLLBACK


def test_a_sender_parked_on_a_wait_takes_the_reply_read_with_its_claim(
    saga: Saga, alice: User, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [{"tool": "ask_agent", "args": {"to": "agent:echo", "type": "ping", "mode": "wait", "payload": {"n": 1}}}]
    (tmp_path / "waiter.json").write_text(json.dumps({"steps": steps, "idle_text": "Got it."}))
    dirs = scripted.playbook_dirs()
    monkeypatch.setattr(scripted, "playbook_dirs", lambda: [*dirs, tmp_path])
    AgentProfile.objects.create(name="waiter", role="Waiter", model="scripted:waiter", tools=["ask_agent"])
    echo = add(saga, alice, "echo", runtime="internal", profile="echo")
    waiter = add(saga, alice, "waiter", runtime="internal", profile="waiter")
    run_one(echo.run.pk)  # its handoff, then idle (the turns of one run: no run it rings)
    with round_trips() as parking:
        run_one(waiter.run.pk)  # its handoff, then the ask: it parks
    assert Run.objects.get(pk=waiter.run.pk).status == Run.Status.WAITING
    with round_trips() as replying:
        run_one(echo.run.pk)  # the reply: the waiter is queued again
    request = AgentRequest.objects.get(sender=waiter)
    assert request.status == AgentRequest.Status.COMPLETED
    assert Run.objects.get(pk=waiter.run.pk).status == Run.Status.QUEUED

    with CaptureQueriesContext(connection) as queries, round_trips() as trips:
        run_one(waiter.run.pk)

    run = Run.objects.get(pk=waiter.run.pk)
    assert (run.status, run.waiting_on_id, run.wait_tool_call_id) == (Run.Status.IDLE, None, "")
    result = TranscriptEntry.objects.filter(run_id=run.pk, message__role="tool").order_by("-seq").first()
    assert result is not None and json.loads(result.message["content"]) == {
        "request_id": request.pk, "status": "completed", "from": "agent:echo", "payload": {"echo": {"n": 1}}
    }  # fmt: skip
    reply = SteeringItem.objects.get(recipient=waiter, request=request)
    assert (reply.consumed_turn, reply.consumed_at) == (result.turn, request.updated_at)
    # The reply is not rendered again as input: the turn after the wait sees only the tool's result.
    user_messages = TranscriptEntry.objects.filter(run_id=run.pk, turn=result.turn, message__role="user")
    assert not user_messages.exists()
    sent = [written_out(q["sql"]) for q in queries.captured_queries]
    if connection.vendor == "postgresql":
        # Neither the request nor the run is read again, nor the steering: the claim read them.
        listing = "\n".join(s[:160] for s in sent)
        assert not any("FROM sagas_agentrequest" in s and "sagas_steeringitem" not in s for s in sent), listing
        assert trips() == 3  # the claim with its reads, its COMMIT with the writes, the turn that rests
        # The reply wakes the parked sender with statements nothing waits for: it costs what a reply
        # to an external asker does; the ask that parks, 7 (its handoff's turn included).
        assert (parking(), replying()) == (7, ROUND_TRIPS)
