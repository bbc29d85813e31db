"""A pool process opens what its doorbells and live notifications go through as it starts
(`config.celery.open_doorbells`, on Celery's `worker_process_init`), not at its first doorbell; a
broker that does not answer then does not hold it up."""

import pytest
from celery.signals import worker_process_init
from redis import Redis

from config import notify
from config.celery import app
from tests.conftest import use_broker
from tests.support import wait_until


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The notifier each call asks for (this process's own is left alone)."""
    asked: list[str] = []
    monkeypatch.setattr(notify, "notifier", lambda: asked.append("notifier"))
    return asked


def test_a_new_pool_process_connects_and_declares_its_doorbells_queue(redis_url: str, made: list[str]) -> None:
    binding = f"_kombu.binding.{app.conf.task_default_queue}"
    with Redis.from_url(redis_url) as server:
        assert not server.exists(binding)  # nothing has rung yet in this test's database

        worker_process_init.send(sender=None)  # as Celery does in each pool process it starts

        wait_until(lambda: server.exists(binding), timeout=10, what="the doorbells' queue declared on the broker")
    assert made == ["notifier"]
    with app.producer_pool.acquire(block=True, timeout=10) as producer:  # the connection it opened, kept
        assert producer.connection is not None and producer.connection.connected


def test_a_broker_that_does_not_answer_is_left_for_the_first_doorbell(
    made: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    use_broker("redis://127.0.0.1:9/0")  # nothing listens there (the next test's fixture sets its own)

    worker_process_init.send(sender=None)

    wait_until(lambda: "could not connect to the broker yet" in caplog.text, timeout=10, what="the warning")
    assert made == ["notifier"]
