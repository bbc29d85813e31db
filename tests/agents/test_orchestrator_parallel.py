"""The support workers really run side by side: with two pool processes, both workers' model calls
are in flight at once (each call waits at a rendezvous for the other; one after another, the first
would wait alone). The benchmark (bench/orchestration.py) measures the speedup; this shows the
overlap itself, and fails if the workers were run one after another."""

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from sagas.models import Saga
from tests.agents.fake_llm import FakeLLM, Reply, say, tool_call
from tests.agents.orchestration_support import settled, submit
from tests.support import CeleryWorker

MEET_S = 30.0  # how long a call waits for the other: far more than a doorbell takes, even on a loaded machine


@pytest.fixture
def two_processes(
    transactional_db: None, redis_url: str, artifacts: Path, runtime_env: dict[str, str]
) -> Iterator[CeleryWorker]:
    started = CeleryWorker(redis_url, artifacts, concurrency=2, env={**runtime_env, "OPENAI_TIMEOUT_S": "60"})
    yield started
    started.kill()


def test_two_support_workers_model_calls_are_in_flight_at_once(
    two_processes: CeleryWorker, fake_llm: FakeLLM, fake_brain: None, saga: Saga, alice: User,
    client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    rendezvous = threading.Barrier(2, timeout=MEET_S)
    met: list[str] = []

    def meet(role: str) -> Callable[[dict[str, Any]], Reply]:
        def answer(body: dict[str, Any]) -> Reply:
            try:
                rendezvous.wait()
                met.append(role)
            except threading.BrokenBarrierError:
                pass  # the other never came while this one waited: not side by side
            return say("", tool_call("finish", {"result": {"summary": f"{role} done"}}))

        return answer

    fake_llm.rule("tester-m", meet("tester"))
    fake_llm.rule("writer-m", meet("writer"))
    fake_llm.script("router-m", say("not a plan"))  # the heuristic plan: the coder, with a tester and a writer
    fake_llm.script("coder-m", say("", tool_call("finish", {"result": "Shipped."})))
    fake_llm.script("review-m", say('{"decision": "approve", "confidence": 0.9}'))
    client = client_for(alice)

    started = submit(client, saga, prompt="Implement the cursor, with tests and a changelog.", brain="fake")
    body = settled(client, started["prompt_id"], timeout=MEET_S + 60)

    assert body["status"] == "completed", body
    assert [w["role"] for w in body["plan"]["workers"]] == ["tester", "writer"]
    assert sorted(met) == ["tester", "writer"]  # each call was answered only once the other had arrived
    assert [r["summary"] for r in body["results"]] == ["tester done", "writer done"]
