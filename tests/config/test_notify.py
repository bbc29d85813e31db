"""The notification thread's batches: lingering, flushing, and what a full backlog drops."""

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from config import notify
from config.notify import Notifier


@pytest.fixture
def notifier(monkeypatch: pytest.MonkeyPatch) -> Iterator[Notifier]:
    monkeypatch.setattr(notify, "BACKLOG_MAX", 1)
    made = Notifier()
    yield made

    async def stop() -> None:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        made.loop.call_soon(made.loop.stop)

    asyncio.run_coroutine_threadsafe(stop(), made.loop).result(5)


def collector() -> tuple[list[list[Any]], Any]:
    sent: list[list[Any]] = []

    async def send_all(items: list[Any]) -> None:
        sent.append(items)

    return sent, send_all


def hold_the_loop(notifier: Notifier) -> threading.Event:
    """A send that keeps the loop busy until the returned event is set."""
    started, released = threading.Event(), threading.Event()

    async def hold(_: Notifier) -> None:
        started.set()
        await asyncio.to_thread(released.wait, 10)

    notifier.submit(hold, "a send that holds the loop")
    assert started.wait(10)
    return released


def test_a_lingering_batch_takes_in_later_items_and_flush_sends_it_at_once(notifier: Notifier) -> None:
    sent, send_all = collector()

    for i in range(3):
        notifier.gather("k", i, send_all, "test", linger=60.0)
    notifier.flush(10)

    assert sent == [[0, 1, 2]]


def test_a_batch_the_full_backlog_dropped_does_not_swallow_later_items(notifier: Notifier) -> None:
    sent, send_all = collector()
    released = hold_the_loop(notifier)
    notifier.gather("first", "a", send_all, "test")  # takes the backlog's one place
    notifier.gather("second", "b", send_all, "test")  # dropped: the backlog is full
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), notifier.loop).result(10)  # the loop saw both
    released.set()
    notifier.flush(10)

    notifier.gather("second", "c", send_all, "test")
    notifier.flush(10)

    assert sent == [["a"], ["c"]]
