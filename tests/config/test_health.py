import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection
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


@pytest.fixture
def silent_database() -> Iterator[None]:
    """The database's address swapped for a port that accepts connections and never answers (a
    host gone quiet), for the connections opened meanwhile."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel completes the handshakes; nobody ever reads or writes
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(listener.getsockname()[1]))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        listener.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="libpq's connect_timeout")
def test_healthz_says_db_down_within_the_connect_timeout_when_the_database_is_silent(
    client: Client, silent_database: None
) -> None:
    timeout = connection.settings_dict["OPTIONS"]["connect_timeout"]
    answered: list[tuple[int, dict[str, str]]] = []
    started = time.monotonic()
    probe = threading.Thread(target=lambda: answered.append(health(client)), daemon=True)
    probe.start()
    probe.join(timeout + 10)  # without the timeout the probe would wait as long as TCP does

    assert answered and answered[0][0] == 503 and answered[0][1]["db"] == "down", answered
    assert time.monotonic() - started < timeout + 10
