"""Celery's Redis transport, keeping one Redis client per channel for its commands.

kombu's builds a new `redis.Redis` client (with its table of response callbacks) for every message
it publishes, which is about a fifth of a `send_task`; the client only borrows connections from the
channel's pool, so one per channel serves every command, as kombu's own long-lived client does.
Selected by `CELERY_BROKER_TRANSPORT`; kombu is pinned in requirements/base.txt.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _commands: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client is None:
            if self._commands is None or self._commands.connection_pool is not self.pool:
                self._commands = self._create_client()  # type: ignore[attr-defined]  # anew for a new pool
            client = self._commands
        yield client


class Transport(redis.Transport):
    Channel = Channel
