"""Waiting without holding anything: a Redis subscription to a kernel wake-up channel, re-reading
the database on every ring and every few tenths of a second anyway, so a lost ring only delays.

The same pattern as the REST API's HTTP waits (sagas/api/waiting.py), which the gateway may not
import (it reaches the kernel through its actions, not its web layer).
"""

import asyncio
import logging
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.db import connections
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


def release_connections() -> None:
    """Close this thread's database connections: a waiting call must hold none."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


class Doorbell:
    """A subscription to one wake-up channel; without Redis it degrades to plain re-checks."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.client: aioredis.Redis | None = None
        self.pubsub: Any = None

    async def __aenter__(self) -> "Doorbell":
        try:
            self.client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2)
            self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            await self.pubsub.subscribe(self.channel)
        except (RedisError, OSError) as exc:
            logger.warning("cannot subscribe to %s, polling the database instead: %s", self.channel, exc)
            self.pubsub = None
        return self

    async def ring_or_timeout(self, timeout: float) -> None:
        if self.pubsub is not None:
            try:
                await self.pubsub.get_message(timeout=timeout)
                return
            except (RedisError, OSError) as exc:
                logger.warning("lost the subscription to %s, polling the database instead: %s", self.channel, exc)
                self.pubsub = None
        await asyncio.sleep(timeout)

    async def __aexit__(self, *exc_info: type[BaseException] | BaseException | TracebackType | None) -> None:
        try:
            if self.pubsub is not None:
                await self.pubsub.aclose()
            if self.client is not None:
                await self.client.aclose()
        except (RedisError, OSError) as exc:
            logger.info("closing the subscription to %s: %s", self.channel, exc)
