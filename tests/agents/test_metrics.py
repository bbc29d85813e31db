"""`/metrics` with a real Celery worker: what its pool processes count reaches the web process's
scrape through the host's multiprocess directory, and the worker's own exporter serves the same."""

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.test import Client

from config.metrics import ROUND_TRIP_BUCKETS
from sagas.models import Run, SteeringItem
from tests.agents.fake_llm import SERVER_ERROR, FakeLLM, finish_once_answered, say, tool_call
from tests.sagas.kernel import AddAgent, finished
from tests.scrape import TOKEN, Samples, buckets, parse, scrape, value
from tests.support import CeleryWorker, free_port, wait_until


@pytest.fixture
def metrics_dir(tmp_path: Path, settings: LazySettings) -> Path:
    """The host's directory, shared by the worker's processes and this (web) process's scrape."""
    directory = tmp_path / "metrics"
    settings.PROMETHEUS_MULTIPROC_DIR = str(directory)
    settings.AGORA_METRICS_TOKEN = TOKEN
    return directory


@pytest.fixture
def exporter_port() -> int:
    return free_port()


@pytest.fixture
def counting_worker(
    transactional_db: None, redis_url: str, artifacts: Path, runtime_env: dict[str, str], metrics_dir: Path,
    exporter_port: int,
) -> Iterator[CeleryWorker]:  # fmt: skip
    env = {**runtime_env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "METRICS_PORT": str(exporter_port)}
    started = CeleryWorker(redis_url, artifacts, env=env)
    yield started
    started.kill()


def test_what_the_worker_processes_count_is_scraped_by_the_web_process(
    counting_worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, client: Client, metrics_dir: Path,
    exporter_port: int,
) -> None:  # fmt: skip
    echo = add_internal("echo", model="scripted:responder")
    fake_llm.script("m-500", SERVER_ERROR)
    bad = add_internal("bad", model="m-500")
    fake_llm.script(
        "model-a", say("", tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": [1]}, "c1"))
    )
    fake_llm.rule("model-a", finish_once_answered("got it", "c2", meanwhile="Waiting for the answer."))
    ann = add_internal("ann", model="model-a")
    wait_until(lambda: finished(ann) and finished(bad), timeout=30, what="ann's and bad's runs to finish")
    wait_until(lambda: Run.objects.get(collaborator=echo).status == Run.Status.IDLE, what="echo to rest")

    def settled() -> Samples | None:
        samples = scrape(client)  # turns are counted just after their commit: wait for the last
        done = value(samples, "agora_turns_total", {"outcome": "completed"}) == 1
        return samples if done and value(samples, "agora_turns_total", {"outcome": "idle"}) >= 1 else None

    samples = wait_until(settled, what="the worker's turns to be counted")

    # Turns, by how they ended: ann completed, bad failed (its only model failed), echo rests.
    assert value(samples, "agora_turns_total", {"outcome": "failed"}) == 1
    # The round trip: from the request's creation to ann's turn taking the reply in.
    reply = SteeringItem.objects.select_related("request").get(
        recipient=ann, kind=SteeringItem.Kind.RESPONSE
    )  # fmt: skip
    assert reply.request is not None and reply.consumed_at is not None
    completed = {"status": "completed"}
    assert value(samples, "agora_round_trip_seconds_count", completed) == 1
    assert value(samples, "agora_round_trip_seconds_sum", completed) == pytest.approx(
        (reply.consumed_at - reply.request.created_at).total_seconds(), abs=1e-3
    )
    counts = buckets(samples, "agora_round_trip_seconds", completed)
    assert list(counts) == [str(float(b)) for b in ROUND_TRIP_BUCKETS] + ["+Inf"]
    assert list(counts.values()) == sorted(counts.values()) and counts["+Inf"] == 1
    # Model calls by model and outcome, and the failure by its class.
    assert value(samples, "agora_model_call_seconds_count", {"model": "model-a", "outcome": "ok"}) == len(
        fake_llm.calls_for("model-a")
    )
    assert value(samples, "agora_model_call_seconds_count", {"model": "m-500", "outcome": "error"}) == 1
    assert (
        value(samples, "agora_model_call_errors_total", {"model": "m-500", "error_class": "InternalServerError"}) == 1
    )
    assert value(samples, "agora_model_call_seconds_count", {"model": "scripted:responder", "outcome": "ok"}) >= 1
    # Gauges read at scrape time: runs by status as the database has them, the live worker.
    for status in Run.Status.values:
        assert value(samples, "agora_runs", {"status": status}) == Run.objects.filter(status=status).count(), status
    assert value(samples, "agora_workers") == 1
    assert value(samples, "agora_queue_depth", {"queue": "celery"}, default=-1) >= 0

    # Counted by the pool processes, not by the worker's main process nor by this one.
    writers = {int(path.stem.rsplit("_", 1)[1]) for path in metrics_dir.glob("*.db")}
    assert counting_worker.proc is not None
    assert writers - {counting_worker.proc.pid}, writers

    # The worker host's own exporter: the same counts, without the system's gauges.
    with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=5) as response:
        exported = parse(response.read().decode())
    for key in ("agora_turns_total", "agora_round_trip_seconds_count", "agora_model_call_errors_total"):
        assert {k: v for k, v in exported.items() if k[0] == key} == {k: v for k, v in samples.items() if k[0] == key}
    assert not any(name == "agora_runs" for name, _ in exported)
