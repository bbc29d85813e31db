"""A turn sends its claim's COMMIT, and each COMMIT before another model call, without waiting
for the answer (config.sql.commit_unawaited): a scripted model's call runs while the answer is on
its way; a call out of the process starts while it is on its way too, and reads it once its
request is out, before the model's answer (providers.once_sent). A COMMIT that failed meanwhile
drops the call's answer: nothing of the turn is written."""

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import DataError, connection

from accounts.models import User
from agents import providers, scripted
from agents.executor import run_turn
from agents.models import AgentProfile
from agents.orchestrator import steps
from agents.orchestrator.actions import submit_prompt
from agents.orchestrator.tasks import run_here
from agents.turns import Turns
from config.sql import defer
from journal.models import JournalEvent
from sagas import actions, wakeups
from sagas.models import Run, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's"),
    pytest.mark.django_db(transaction=True),
]


def in_flight() -> bool:
    return connection.connection is not None and connection.connection.agora_unawaited is not None


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """Each model call as it starts: the model, and whether a COMMIT's answer was still on its way."""
    calls: list[tuple[str, bool]] = []
    next_move, complete = scripted.next_move, providers.OpenAICompatibleProvider.complete

    def scripted_move(name: str, messages: Any) -> Any:
        calls.append((f"scripted:{name}", in_flight()))
        return next_move(name, messages)

    def http_call(self: Any, **kwargs: Any) -> Any:
        calls.append((kwargs["model"], in_flight()))
        return complete(self, **kwargs)

    monkeypatch.setattr(scripted, "next_move", scripted_move)
    monkeypatch.setattr(providers.OpenAICompatibleProvider, "complete", http_call)
    yield calls


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """In order: each model answer as it comes back (whether a COMMIT's answer was still unread
    then), and each run's doorbell."""
    seen: list[tuple[str, Any]] = []
    completion_from = providers.completion_from

    def answered(*args: Any) -> Any:
        seen.append(("answer", in_flight()))
        return completion_from(*args)

    monkeypatch.setattr(providers, "completion_from", answered)
    monkeypatch.setattr(wakeups, "ring_run", lambda run_id: seen.append(("rung", run_id)))
    return seen


def test_a_scripted_model_call_runs_while_the_commit_before_it_is_on_its_way(
    saga: Saga, alice: User, observed: list[tuple[str, bool]]
) -> None:
    AgentProfile.objects.create(name="echo", role="Echo", model="scripted:responder", tools=["reply", "finish"])
    echo, _ = actions.add_agent(saga=saga, name="echo", role="Echo", task="Answer", runtime="internal",
                                profile="echo", by=alice)  # fmt: skip
    asker, _ = actions.add_agent(saga=saga, name="asker", role="Asker", task="Ask", runtime="external", by=alice)
    run_turn(echo.run.pk)  # the handoff
    request, _ = actions.ask_agent(sender=asker, to="agent:echo", type="ping", payload={"n": 1})
    observed.clear()

    run_turn(echo.run.pk)

    # The claim's COMMIT, then the reply's (whose turn calls the model again), each on its way.
    assert observed == [("scripted:responder", True), ("scripted:responder", True)]
    assert not in_flight()
    request.refresh_from_db()
    assert request.status == "completed" and Run.objects.get(pk=echo.run.pk).status == Run.Status.IDLE
    types = list(JournalEvent.objects.filter(saga=saga).values_list("type", flat=True))
    assert types.count("request.delivered") == types.count("request.completed") == 1


def test_a_call_out_of_the_process_reads_the_commit_before_it_once_its_request_is_out(
    saga: Saga, alice: User, model_here: FakeLLM, observed: list[tuple[str, bool]], log: list[tuple[str, Any]]
) -> None:
    model_here.script("echo-m", say("Done."))
    AgentProfile.objects.create(name="echo", role="Echo", model="echo-m", tools=[])
    echo, _ = actions.add_agent(saga=saga, name="echo", role="Echo", task="Answer", runtime="internal",
                                profile="echo", by=alice)  # fmt: skip
    log.clear()  # its doorbell
    run_turn(echo.run.pk)

    assert observed == [("echo-m", True)]  # the request left with the claim's COMMIT on its way
    assert log == [("answer", False)]  # read while the model worked
    assert JournalEvent.objects.filter(saga=saga, type="llm_call").count() == 1
    assert Run.objects.get(pk=echo.run.pk).status == Run.Status.IDLE


def test_a_commit_that_fails_during_the_call_drops_its_answer_and_writes_nothing(
    saga: Saga, alice: User, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_here.script("echo-m", say("Done."))
    AgentProfile.objects.create(name="echo", role="Echo", model="echo-m", tools=[])
    echo, _ = actions.add_agent(saga=saga, name="echo", role="Echo", task="Answer", runtime="internal",
                                profile="echo", by=alice)  # fmt: skip
    start = Turns.start

    def failing_start(self: Turns) -> bool:
        go_on = start(self)
        defer("SELECT 1 / 0", [])  # fails in the claim's COMMIT, which is read during the model call
        return go_on

    monkeypatch.setattr(Turns, "start", failing_start)

    with pytest.raises(DataError):  # the task fails; the run stays queued for the reconciler
        run_turn(echo.run.pk)

    assert len(model_here.calls_for("echo-m")) == 1  # called once, its answer dropped
    assert Run.objects.get(pk=echo.run.pk).status == Run.Status.QUEUED
    assert not JournalEvent.objects.filter(saga=saga, type__in=["worker_start", "llm_call"]).exists()


@pytest.mark.usefixtures("fake_brain")
def test_a_step_hands_its_first_worker_on_with_its_commit_on_its_way(
    saga: Saga, alice: User, model_here: FakeLLM, log: list[tuple[str, Any]], settings: LazySettings
) -> None:
    """The routing step claims its first support worker for its own task; the step's COMMIT is read
    during that worker's model call, and its doorbells (the other worker's first turn) ring then."""
    settings.AGORA_HOOKS_INLINE = True  # the steps run in this process
    workers = '[{"role": "tester", "goal": "Test."}, {"role": "writer", "goal": "Note."}]'
    model_here.script("router-m", say(f'{{"primary_role": "coder", "workers": {workers}}}'))
    model_here.script("tester-m", say("", tool_call("finish", {"result": "Tested."})))
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it, with tests and a changelog.", brain="fake")
    log.clear()  # the lead's doorbell

    here = steps.advance(str(prompt.pk))

    assert [t.collaborator.name for t in here] == [prompt.worker_name("tester")]
    assert in_flight() and log == [("answer", False)]  # the router's; the step's COMMIT on its way, no doorbell
    run_here(here)

    writer = Run.objects.get(collaborator__saga=saga, collaborator__name=prompt.worker_name("writer"))
    assert log == [("answer", False), ("rung", writer.pk), ("answer", False)]  # rung during the tester's call
    assert Run.objects.get(collaborator=here[0].collaborator).status == Run.Status.COMPLETED
    types = list(JournalEvent.objects.filter(saga=saga).values_list("type", flat=True))
    assert (types.count("plan.created"), types.count("llm_call")) == (1, 2)  # the router's call, the tester's
