"""A turn sends its claim's COMMIT, and each COMMIT before another model call, without waiting
for the answer (config.sql.commit_unawaited): a scripted model's call runs while the answer is on
its way, a call out of the process starts only once it is in."""

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from accounts.models import User
from agents import providers, scripted
from agents.executor import run_turn
from agents.models import AgentProfile
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Run, Saga
from tests.agents.fake_llm import FakeLLM, say

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


def test_a_call_out_of_the_process_starts_only_once_the_commit_before_it_is_in(
    saga: Saga, alice: User, model_here: FakeLLM, observed: list[tuple[str, bool]]
) -> None:
    model_here.script("echo-m", say("Done."))
    AgentProfile.objects.create(name="echo", role="Echo", model="echo-m", tools=[])
    echo, _ = actions.add_agent(saga=saga, name="echo", role="Echo", task="Answer", runtime="internal",
                                profile="echo", by=alice)  # fmt: skip
    run_turn(echo.run.pk)

    assert observed == [("echo-m", False)]  # the claim's COMMIT was in before the request left
    assert JournalEvent.objects.filter(saga=saga, type="llm_call").count() == 1
