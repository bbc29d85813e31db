"""This process's live notifications: journal events to the channel layer, wake-ups to Redis.

Both are doorbells rung after commit, at most once (whoever misses one reads the database), so
the committing thread only hands them over: a turn never waits on the dashboard's fan-out or on
HTTP waiters. One event loop on a daemon thread sends them one after another (the items of one
key in the order they were handed over) and keeps its Redis connections for the process's
lifetime. It is made anew in a forked child (a Celery pool process), where the parent's thread
does not exist.
"""

import asyncio
import atexit
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from redis.asyncio import Redis

from config.per_process import PerProcess

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0
BACKLOG_MAX = 10_000

Send = Callable[["Notifier"], Awaitable[object]]
SendAll = Callable[[list[Any]], Awaitable[object]]


class Notifier:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[tuple[Send, str]] = asyncio.Queue(BACKLOG_MAX)
        # Items waiting to go out together, by key: filled by the committing threads, emptied by
        # the send. Only a new batch wakes the loop; a batch may linger there to take in more.
        self.batches: dict[str, list[Any]] = {}
        self.lock = threading.Lock()
        self.lingering: dict[str, tuple[asyncio.TimerHandle, Send, str]] = {}
        self._redis: Redis | None = None
        threading.Thread(target=self.loop.run_forever, name="notify", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.drain(), self.loop)

    def submit(self, send: Send, what: str) -> None:
        """Hand over `send(notifier)`; `what` names it in the log if it fails."""
        self.loop.call_soon_threadsafe(self.enqueue, send, what)

    def gather(self, key: str, item: Any, send_all: SendAll, what: str, *, linger: float = 0.0) -> None:
        """Hand over `item` to go out with the others of its key: a batch that is still waiting
        takes it, or a new one is queued, after `linger` seconds. Under load a few sends carry
        many items, and the loop thread wakes once per batch, not per item."""
        with self.lock:
            if key in self.batches:
                self.batches[key].append(item)
                return
            self.batches[key] = [item]
        self.loop.call_soon_threadsafe(self.queue_batch, key, send_all, what, linger)

    def ping(self, channel: str) -> None:
        """Publish a wake-up on a Redis channel; one ping covers all those waiting for it."""
        self.gather(f"ping:{channel}", None, lambda _: self.publish(channel), f"wake-up publish on {channel}")

    def enqueue(self, send: Send, what: str) -> bool:
        try:
            self.queue.put_nowait((send, what))
            return True
        except asyncio.QueueFull:
            logger.warning("%s dropped: backlog full", what)
            return False

    def queue_batch(self, key: str, send_all: SendAll, what: str, linger: float) -> None:
        send: Send = lambda notifier: send_all(notifier.take_batch(key))  # noqa: E731
        if linger <= 0:
            self.enqueue_batch(key, send, what)
            return
        timer = self.loop.call_later(linger, self.end_linger, key)
        self.lingering[key] = (timer, send, what)

    def end_linger(self, key: str) -> None:
        _, send, what = self.lingering.pop(key)
        self.enqueue_batch(key, send, what)

    def enqueue_batch(self, key: str, send: Send, what: str) -> None:
        if not self.enqueue(send, what):
            self.take_batch(key)  # dropped with it: the key's next item starts a new batch

    def take_batch(self, key: str) -> list[Any]:
        with self.lock:
            return self.batches.pop(key)

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

    async def send_now(self) -> None:
        for key, (timer, _, _) in list(self.lingering.items()):
            timer.cancel()
            self.end_linger(key)
        await self.queue.join()

    def flush(self, timeout: float) -> None:
        """Wait until everything handed over so far was sent (or failed), lingering or not."""
        try:
            asyncio.run_coroutine_threadsafe(self.send_now(), self.loop).result(timeout)
        except TimeoutError:
            logger.warning("%s notifications still unsent", self.queue.qsize())


notifier = PerProcess(Notifier)


@atexit.register
def flush_at_exit() -> None:
    """A process that exits normally sends what it committed first."""
    if (made := notifier.made()) is not None:
        made.flush(SEND_TIMEOUT_S)
