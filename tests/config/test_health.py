import logging

import pytest
from django.test import Client

from config import liveness
from config.celery import app as celery_app
from tests.support import CeleryWorker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def health(client: Client) -> tuple[int, dict[str, str]]:
    response = client.get("/healthz")
    return response.status_code, response.json()


def test_healthz_is_ok_with_a_worker_and_503_once_it_stops(client: Client, celery_worker: CeleryWorker) -> None:
    assert health(client) == (200, {"db": "ok", "redis": "ok", "worker": "ok"})

    celery_worker.stop()  # a clean stop takes the worker off the list at once

    assert health(client) == (503, {"db": "ok", "redis": "ok", "worker": "down"})


def test_a_killed_worker_is_reported_down_once_its_beats_stop(client: Client, celery_worker: CeleryWorker) -> None:
    wait_until(lambda: health(client)[0] == 200, what="healthz to see the worker")

    celery_worker.kill()  # kill -9: nothing says goodbye

    wait_until(lambda: health(client)[0] == 503, timeout=liveness.ALIVE_S + 10, what="healthz to report it down")
    assert health(client) == (503, {"db": "ok", "redis": "ok", "worker": "down"})


def test_a_probe_asks_no_worker_anything(
    client: Client, celery_worker: CeleryWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a broadcast ping waits for replies from every worker; the probe reads the beats
    the workers' loops write instead (config/liveness.py)."""

    def no_broadcast(*args: object, **kwargs: object) -> None:
        raise AssertionError("healthz broadcast to the workers")

    monkeypatch.setattr(celery_app.control, "broadcast", no_broadcast)

    for _ in range(3):
        assert health(client) == (200, {"db": "ok", "redis": "ok", "worker": "ok"})


def test_healthz_names_redis_when_it_does_not_answer(
    client: Client, settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1

    with caplog.at_level(logging.INFO):
        assert health(client) == (503, {"db": "ok", "redis": "down", "worker": "down"})

    # A booting stack's 503 is information for whoever waits on it, not an error.
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [r.getMessage() for r in caplog.records if r.name == "config.health"] == [
        "healthz: db ok, redis down, worker down"
    ]


def test_a_worker_starts_without_deprecation_warnings(celery_worker: CeleryWorker) -> None:
    log = celery_worker.log()
    assert "ready." in log  # the whole start-up is in the log
    assert "DeprecationWarning" not in log and "celery upgrade settings" not in log, log
