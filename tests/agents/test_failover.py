"""Failover: a dead worker's turn moves to a live one within seconds, and a live worker's turn,
however long its model call, stays with it. Real workers, a real beat, the fake model server."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sagas.models import Run, Saga
from sagas.tasks import reconcile
from tests.agents.fake_llm import GATE, HANG, FakeLLM, say, tool_call
from tests.sagas.kernel import AddAgent, events_of, finished
from tests.support import CeleryBeat, CeleryWorker, wait_until

TAKEOVER_LIMIT_S = 10.0  # the README's guarantee with the default lease and reconcile interval


@pytest.fixture
def production_env(fake_llm: FakeLLM) -> dict[str, str]:
    """The fake provider, with production's lease and reconcile interval (no AGORA_LEASE_S)."""
    return {"OPENAI_BASE_URL": fake_llm.url, "OPENAI_API_KEY": "test", "OPENAI_TIMEOUT_S": "60"}


@pytest.fixture
def workers(transactional_db: None, redis_url: str, artifacts: Path) -> Iterator[list[CeleryWorker]]:
    started: list[CeleryWorker] = []
    yield started
    for worker in started:
        worker.kill()


def test_a_dead_workers_turn_is_taken_over_by_the_live_one_within_ten_seconds_and_done_once(
    workers: list[CeleryWorker],
    production_env: dict[str, str],
    fake_llm: FakeLLM,
    add_internal: AddAgent,
    saga: Saga,
    redis_url: str,
    artifacts: Path,
) -> None:
    w1 = CeleryWorker(redis_url, artifacts, env=production_env)
    workers.append(w1)
    beat = CeleryBeat(redis_url, artifacts, env=production_env)
    try:
        fake_llm.script("model-a", HANG, say("", tool_call("finish", {"result": "moved on"}, "c1")))
        ann = add_internal("ann", model="model-a")
        wait_until(lambda: len(fake_llm.calls_for("model-a")) == 1, what="w1's model call")
        workers.append(CeleryWorker(redis_url, artifacts, env=production_env))  # w2, alive and idle

        w1.kill()  # the whole process group, as when its host dies
        killed = time.monotonic()
        wait_until(lambda: len(fake_llm.calls_for("model-a")) == 2, timeout=30, interval=0.02, what="the takeover")
        takeover = time.monotonic() - killed
        run = wait_until(lambda: finished(ann), what="ann's run to finish")
    finally:
        beat.stop()

    assert takeover < TAKEOVER_LIMIT_S, f"takeover took {takeover:.1f}s"
    assert run.status == Run.Status.COMPLETED and run.result == "moved on"
    # The turn was done once: one model answer stored, one completion, one reclaim.
    assert len(events_of(saga, "llm_call")) == 1
    assert len(events_of(saga, "run.completed")) == 1
    assert [e.data["turn"] for e in events_of(saga, "run.reclaimed")] == [1]
    # Which host ran what: the one that lost the lease, the one that finished the turn.
    w2 = workers[1]
    assert [e.data["lost_by"] for e in events_of(saga, "run.reclaimed")] == [w1.name]
    assert [(e.data["turn"], e.data["worker"]) for e in events_of(saga, "llm_call")] == [
        (2, w2.name)
    ]  # turn 1 again, as turn 2
    assert [e.data["worker"] for e in events_of(saga, "run.completed")] == [w2.name]
    assert run.worker == w2.name


def test_a_model_call_longer_than_the_lease_stays_with_its_live_worker(
    workers: list[CeleryWorker],
    production_env: dict[str, str],
    fake_llm: FakeLLM,
    add_internal: AddAgent,
    saga: Saga,
    redis_url: str,
    artifacts: Path,
) -> None:
    lease_s = 1.5
    workers.append(CeleryWorker(redis_url, artifacts, env={**production_env, "AGORA_LEASE_S": str(lease_s)}))
    fake_llm.script("model-a", GATE, say("", tool_call("finish", {"result": "slow but mine"}, "c1")))
    ann = add_internal("ann", model="model-a")
    wait_until(lambda: len(fake_llm.calls_for("model-a")) == 1, what="the model call")

    leases: set[object] = set()

    def renewed_past_the_lease() -> bool:
        reconcile()  # as beat does, more often than it would
        leases.add(Run.objects.get(collaborator=ann).lease_until)
        # Six leases seen: the call has outlasted its first lease by over a lease.
        return len(leases - {None}) >= 6

    wait_until(renewed_past_the_lease, timeout=30, interval=0.1, what="the heartbeat to renew the lease")
    fake_llm.gate.set()
    run = wait_until(lambda: finished(ann), what="ann's run to finish")

    assert run.status == Run.Status.COMPLETED and run.result == "slow but mine"
    assert events_of(saga, "run.reclaimed") == []
    assert len(fake_llm.calls_for("model-a")) == 1
