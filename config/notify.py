"""This process's live notifications: journal events to the channel layer, wake-ups to Redis.

Both are doorbells rung after commit, at most once (whoever misses one reads the database), so
the committing thread only hands them over: a turn never waits on the dashboard's fan-out or on
HTTP waiters. One event loop on a daemon thread sends them one after another, in the order they
were handed over, and keeps its Redis connections for the process's lifetime. It is made anew in
a forked child (a Celery pool process), where the parent's thread does not exist.
"""

import asyncio
import atexit
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from redis.asyncio import Redis

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0
BACKLOG_MAX = 10_000

Send = Callable[["Notifier"], Awaitable[object]]
SendAll = Callable[[list[Any]], Awaitable[object]]


class Notifier:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[tuple[Send, str]] = asyncio.Queue(BACKLOG_MAX)
        self.batches: dict[str, list[Any]] = {}  # items waiting to go out together, by key
        self._redis: Redis | None = None
        threading.Thread(target=self.loop.run_forever, name="notify", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.drain(), self.loop)

    def submit(self, send: Send, what: str) -> None:
        """Hand over `send(notifier)`; `what` names it in the log if it fails."""
        self.loop.call_soon_threadsafe(self.enqueue, send, what)

    def gather(self, key: str, item: Any, send_all: SendAll, what: str) -> None:
        """Hand over `item` to go out with the others of its key: a batch that is still waiting
        takes it, or a new one is queued. Under load a few sends carry many items."""
        self.loop.call_soon_threadsafe(self.enqueue_gathered, key, item, send_all, what)

    def ping(self, channel: str) -> None:
        """Publish a wake-up on a Redis channel; one ping covers all those waiting for it."""
        self.gather(f"ping:{channel}", None, lambda _: self.publish(channel), f"wake-up publish on {channel}")

    def enqueue(self, send: Send, what: str) -> None:
        try:
            self.queue.put_nowait((send, what))
        except asyncio.QueueFull:
            logger.warning("%s dropped: backlog full", what)

    def enqueue_gathered(self, key: str, item: Any, send_all: SendAll, what: str) -> None:
        if key in self.batches:
            self.batches[key].append(item)
            return
        self.batches[key] = [item]
        self.enqueue(lambda notifier: send_all(notifier.batches.pop(key)), what)

    async def publish(self, channel: str) -> None:
        if self._redis is None:
            self._redis = Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        await self._redis.publish(channel, "1")

    async def drain(self) -> None:
        while True:
            send, what = await self.queue.get()
            try:
                await asyncio.wait_for(send(self), SEND_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - Redis down, a timeout, a full channel: log and go on
                logger.warning("%s failed: %s", what, exc)
            finally:
                self.queue.task_done()

    def flush(self, timeout: float) -> None:
        """Wait until everything handed over so far was sent (or failed)."""
        try:
            asyncio.run_coroutine_threadsafe(self.queue.join(), self.loop).result(timeout)
        except TimeoutError:
            logger.warning("%s notifications still unsent", self.queue.qsize())


_lock = threading.Lock()
_notifier: Notifier | None = None


def notifier() -> Notifier:
    global _notifier
    with _lock:
        if _notifier is None or _notifier.pid != os.getpid():
            _notifier = Notifier()
        return _notifier


@atexit.register
def flush_at_exit() -> None:
    """A process that exits normally sends what it committed first."""
    if _notifier is not None and _notifier.pid == os.getpid():
        _notifier.flush(SEND_TIMEOUT_S)
