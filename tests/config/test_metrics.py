"""`/metrics`: who may read it, the gauges read from Redis at scrape time, and the per-host
directory the processes count into."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.test import Client

from config.celery import app as celery_app
from config.metrics import start_worker_exporter
from tests.scrape import TOKEN, parse, scrape, value
from tests.support import BASE_DIR, free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def this_process(settings: LazySettings) -> None:
    settings.PROMETHEUS_MULTIPROC_DIR = ""  # the test process's own counts


def get(client: Client, authorization: str | None = None, remote: str = "127.0.0.1") -> tuple[int, str]:
    headers = {"Authorization": authorization} if authorization else {}
    response = client.get("/metrics", headers=headers, REMOTE_ADDR=remote)
    return response.status_code, response.content.decode()


def test_with_a_token_only_its_bearer_reads_the_metrics(client: Client, settings: LazySettings) -> None:
    settings.AGORA_METRICS_TOKEN = TOKEN
    settings.DEBUG = True  # even on loopback in DEBUG: a token, once set, is the rule

    assert get(client)[0] == 401
    assert client.get("/metrics").headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert get(client, "Bearer wrong")[0] == 401
    assert get(client, f"Token {TOKEN}")[0] == 401  # the API's scheme is not this one's
    status, text = get(client, f"Bearer {TOKEN}", remote="10.1.2.3")
    assert status == 200 and "agora_turns" in text and "agora_runs" in text
    # HEAD as GET (a monitor's check), no body; and the same rule
    assert client.head("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.head("/metrics").status_code == 401


def test_without_a_token_only_loopback_in_debug_reads_them(client: Client, settings: LazySettings) -> None:
    settings.AGORA_METRICS_TOKEN = ""
    settings.DEBUG = False
    assert get(client) == (403, "Set AGORA_METRICS_TOKEN to read the metrics.\n")

    settings.DEBUG = True
    assert get(client)[0] == 200
    assert get(client, remote="::1")[0] == 200
    assert get(client, remote="10.1.2.3")[0] == 403


def test_queue_depth_and_live_workers_are_read_from_redis_at_scrape_time(
    client: Client, settings: LazySettings
) -> None:
    settings.AGORA_METRICS_TOKEN = TOKEN
    settings.AGORA_METRICS_QUEUES = ["celery", "bulk"]
    for _ in range(3):  # nobody consumes `bulk` here: they wait
        celery_app.send_task("sagas.tasks.reconcile", queue="bulk")

    samples = scrape(client)

    assert value(samples, "agora_queue_depth", {"queue": "bulk"}, default=-1) == 3
    assert value(samples, "agora_queue_depth", {"queue": "celery"}, default=-1) == 0
    assert value(samples, "agora_workers", default=-1) == 0  # no worker beats in this test


def test_when_redis_is_away_the_metrics_still_answer_without_its_gauges(client: Client, settings: LazySettings) -> None:
    settings.AGORA_METRICS_TOKEN = TOKEN
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1

    samples = scrape(client)

    assert ("agora_workers", frozenset()) not in samples
    assert value(samples, "agora_runs", {"status": "running"}, default=-1) == 0


def test_the_metrics_are_prometheus_text_a_scraper_parses(client: Client, settings: LazySettings) -> None:
    settings.AGORA_METRICS_TOKEN = TOKEN
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response["Content-Type"].startswith("text/plain; version=")
    names = {name for name, _ in parse(response.content.decode())}
    assert {"agora_runs", "agora_queue_depth", "agora_workers"} <= names


def test_resetting_the_directory_empties_it_and_refuses_without_one(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_12345.db").write_bytes(b"stale")
    (directory / "keep.txt").write_text("not ours")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}

    refused = subprocess.run(
        [sys.executable, "-m", "config.metrics_dir", "reset"], cwd=BASE_DIR, env=env, capture_output=True, text=True
    )
    done = subprocess.run(
        [sys.executable, "-m", "config.metrics_dir", "reset"], cwd=BASE_DIR, capture_output=True, text=True,
        env={**env, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )  # fmt: skip

    assert refused.returncode == 1 and "PROMETHEUS_MULTIPROC_DIR is not set" in refused.stderr
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in directory.iterdir()) == ["keep.txt"]


def test_a_worker_exporter_without_a_directory_refuses_to_serve_zeros(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    monkeypatch.setenv("METRICS_PORT", str(port))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)

    start_worker_exporter()

    assert "METRICS_PORT is set but PROMETHEUS_MULTIPROC_DIR is not" in caplog.text
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # nothing took the port
