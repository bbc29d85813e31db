"""Doorbells rung after commit: a Celery task for an internal run's next turn, a Redis publish for
HTTP waiters. Losing one delays work and never loses it: the reconciler re-rings from the database."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial

from celery import current_app
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from config.notify import notifier

logger = logging.getLogger(__name__)

RUN_TURN_TASK = "agents.tasks.run_turn"  # by name: the kernel never imports the runtime
REMOTE_CALL_TASK = "gateways.a2a.follow_remote_call"  # an ask_remote_agent call's next step


def steering_channel(collaborator_id: int) -> str:
    return f"agora:steering:{collaborator_id}"


def request_channel(request_id: str) -> str:
    return f"agora:request:{request_id}"


def ring_run_after_commit(run_id: str) -> None:
    transaction.on_commit(partial(ring_run, run_id))


def ring_run(run_id: str) -> None:
    rung = _rung.get()
    if rung is not None and run_id not in rung:
        rung.append(run_id)
    try:
        current_app.send_task(RUN_TURN_TASK, args=[run_id])
    except (BrokerError, RedisError, OSError) as exc:
        logger.warning("could not queue a turn for %s (the reconciler will): %s", run_id, exc)


_rung: ContextVar[list[str] | None] = ContextVar("rung", default=None)


@contextmanager
def rung_here() -> Iterator[list[str]]:
    """The runs rung (ring_run()) inside the block, in order, each once: a worker that is about to
    be free may take one itself rather than wait for its doorbell to come back through the broker.
    The doorbells still go: whichever comes first claims the run, the other finds it taken."""
    rung: list[str] = []
    token = _rung.set(rung)
    try:
        yield rung
    finally:
        _rung.reset(token)


def ring_remote_call_after_commit(call_id: str, step: int, *, delay_s: float = 0) -> None:
    transaction.on_commit(partial(ring_remote_call, call_id, step, delay_s=delay_s))


def ring_remote_call(call_id: str, step: int, *, delay_s: float = 0) -> None:
    try:
        current_app.send_task(REMOTE_CALL_TASK, args=[call_id, step], countdown=delay_s or None)
    except (BrokerError, RedisError, OSError) as exc:
        logger.warning("could not ring remote call %s (the reconciler will): %s", call_id, exc)


def publish_after_commit(*channels: str) -> None:
    transaction.on_commit(partial(publish, channels))


def publish(channels: tuple[str, ...]) -> None:
    for channel in channels:
        notifier().ping(channel)
