"""A turn that raises out of its task leaves its run `running` until the lease lapses; the
reconciler takes the turn back and the next task makes it again. A run whose turn is taken back
too often in a row ends; one taken back now and then over its life goes on."""

import pytest
from django.conf import LazySettings
from django.utils import timezone

from accounts.models import User
from agents.executor import run_turn
from agents.models import AgentProfile
from sagas import actions
from sagas.models import Run, Saga
from sagas.tasks import reconcile
from tests.agents.fake_llm import FakeLLM, say, tool_call

pytestmark = pytest.mark.django_db(transaction=True)


class NoBeats:
    def add(self, turns: object) -> None: ...
    def remove(self, turns: object) -> None: ...


@pytest.fixture(autouse=True)
def no_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests lapse leases themselves. The process's heartbeat thread would renew one whose
    renewal was under way when its failed task ended, after the test lapsed it, and nothing
    would be taken back."""
    monkeypatch.setattr("agents.executor.heartbeat", NoBeats)


def test_a_turn_that_fails_its_task_each_time_ends_the_run_once_taken_back_too_often(
    saga: Saga, alice: User, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch, settings: LazySettings
) -> None:
    """A turn that raises out of its task leaves the run `running` until its lease lapses; the
    reconciler takes it back and the next task makes it again, model call and all. Past
    AGORA_MAX_RECLAIMS the run fails instead of being made again for ever."""
    settings.AGORA_MAX_RECLAIMS = 2
    model_here.script("asker-m", *(say("", tool_call("finish", {"result": "done"}, f"c{i}")) for i in range(5)))
    AgentProfile.objects.create(name="asker", role="Asker", model="asker-m", tools=["finish"])
    asker, _ = actions.add_agent(saga=saga, name="asker", role="Asker", task="Ask", runtime="internal",
                                 profile="asker", by=alice)  # fmt: skip

    def broken(*args: object) -> None:
        raise RuntimeError("a fault no code foresaw")

    monkeypatch.setattr("agents.turns.execute", broken)  # the fault, injected where the tools run
    for _ in range(3):  # the first try and its two reclaims
        with pytest.raises(RuntimeError):
            run_turn(asker.run.pk)
        Run.objects.filter(pk=asker.run.pk).update(lease_until=timezone.now())  # as if the lease lapsed
        reconcile()
    run_turn(asker.run.pk)

    run = Run.objects.get(pk=asker.run.pk)
    assert (run.status, run.reclaims, run.reclaims_in_row) == (Run.Status.FAILED, 3, 3)
    assert run.error.startswith("Its turn was taken back 3 times in a row")
    assert len(model_here.calls_for("asker-m")) == 3  # the model was not asked a fourth time


def test_reclaims_with_turns_ended_between_them_do_not_end_the_run(
    saga: Saga, alice: User, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch, settings: LazySettings
) -> None:
    """A long-lived run taken back now and then (a deploy, a dead host), with turns that ended between:
    more reclaims over its life than AGORA_MAX_RECLAIMS, never more than one in a row; it goes on."""
    from agents import turns

    settings.AGORA_MAX_RECLAIMS = 1
    looks = [say("", tool_call("get_collaborators", {}, f"look{i}")) for i in range(3)]
    model_here.script("asker-m", *looks, say("", tool_call("finish", {"result": "done"})))
    AgentProfile.objects.create(name="asker", role="Asker", model="asker-m", tools=["get_collaborators", "finish"])
    asker, _ = actions.add_agent(saga=saga, name="asker", role="Asker", task="Ask", runtime="internal",
                                 profile="asker", by=alice)  # fmt: skip
    real, calls = turns.execute, iter(range(10))

    def flaky(*args: object) -> object:
        if next(calls) in (0, 2):  # the first look and the third fail their task; the second ends its turn
            raise RuntimeError("a worker lost mid-turn")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("agents.turns.execute", flaky)
    for _ in range(6):
        if Run.objects.get(pk=asker.run.pk).is_finished:
            break
        try:
            run_turn(asker.run.pk)
        except RuntimeError:
            Run.objects.filter(pk=asker.run.pk).update(lease_until=timezone.now())  # as if the lease lapsed
            reconcile()

    run = Run.objects.get(pk=asker.run.pk)
    assert (run.status, run.result, run.reclaims, run.reclaims_in_row) == (Run.Status.COMPLETED, "done", 2, 1)
    assert len(model_here.calls_for("asker-m")) == 4
