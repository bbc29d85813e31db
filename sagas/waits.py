"""How many HTTP waits (an `ask_agent` in `wait` mode, a steering long-poll) an agent and a saga
have in progress, whichever gateway holds them (the REST API, MCP): each holds a Redis connection
until it ends. Counted in Redis sorted sets with a lapse time, so that a dead web process cannot
leak slots.

Every such wait, whichever gateway holds it, listens on a `Doorbell` (a Redis subscription to a
kernel wake-up channel, `sagas.wakeups`) and re-reads the database between rings holding no
database connection (`release_connections`)."""

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import connections
from redis.exceptions import RedisError

from sagas import errors
from sagas.models import Collaborator

logger = logging.getLogger(__name__)


@dataclass
class WaitSlot:
    """One HTTP wait in progress, counted for its agent and its saga until released (or, if the
    process dies first, until it lapses on its own)."""

    keys: tuple[str, str]
    member: str
    lapse_s: float = 0.0  # how long it is counted unless renewed (a process that died holds it no longer)
    released: bool = False

    def renew(self) -> None:
        """Count it for another `lapse_s`: for a wait with no end of its own (an A2A stream)."""
        if self.released:
            return
        expires = time.time() + self.lapse_s
        try:
            with slot_client().pipeline(transaction=False) as pipe:
                for key in self.keys:
                    pipe.zadd(key, {self.member: expires}, xx=True)
                    pipe.expireat(key, math.ceil(expires))
                pipe.execute()
        except (RedisError, OSError) as exc:
            logger.info("could not renew wait slot %s: %s", self.member, exc)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            with slot_client().pipeline(transaction=False) as pipe:
                for key in self.keys:
                    pipe.zrem(key, self.member)
                pipe.execute()
        except (RedisError, OSError) as exc:
            logger.info("could not release wait slot %s (it lapses on its own): %s", self.member, exc)


# Drop the lapsed slots, check both caps, then take a slot in both sets, in one step. Returns 0, or
# the index (1: the agent, 2: the saga) of the cap that is full.
_TAKE_SLOT = """
local now, expires, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i, key in ipairs(KEYS) do redis.call('ZREMRANGEBYSCORE', key, '-inf', now) end
for i, key in ipairs(KEYS) do
  if redis.call('ZCARD', key) >= tonumber(ARGV[3 + i]) then return i end
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, expires, member)
  redis.call('EXPIREAT', key, math.ceil(expires))
end
return 0
"""
_slot_clients: dict[str, redis.Redis] = {}


def slot_client() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _slot_clients:
        _slot_clients[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return _slot_clients[url]


def hold_wait(collaborator: Collaborator) -> WaitSlot:
    """A place among the HTTP waits in progress: at most `AGORA_MAX_WAITS_PER_AGENT` per agent and
    `AGORA_MAX_WAITS_PER_SAGA` per saga, since each holds a Redis connection; past either,
    `too_many_waits` (429). Taken before anything is written; a slot whose process died lapses
    after the longest possible wait. Without Redis nobody holds a connection, so nothing is capped."""
    keys = (f"agora:waits:agent:{collaborator.pk}", f"agora:waits:saga:{collaborator.saga_id}")
    lapse = max(settings.AGORA_MAX_WAIT_S, settings.AGORA_STEERING_POLL_MAX_S) + 60
    slot = WaitSlot(keys=keys, member=uuid.uuid4().hex, lapse_s=lapse)
    now = time.time()
    caps = (settings.AGORA_MAX_WAITS_PER_AGENT, settings.AGORA_MAX_WAITS_PER_SAGA)
    try:
        full = slot_client().eval(_TAKE_SLOT, 2, *keys, now, now + lapse, slot.member, *caps)
    except (RedisError, OSError) as exc:
        logger.warning("cannot count waits (Redis unavailable), not capping this one: %s", exc)
        slot.released = True
        return slot
    if full:
        who = collaborator.handle if full == 1 else "this saga"
        raise errors.TooManyWaits(f"{who} already has {caps[full - 1]} waits in progress.", limit=caps[full - 1])
    return slot


@contextmanager
def given_back_if_raised(slot: WaitSlot | None) -> Iterator[None]:
    """The writes a wait comes after (the ask, the cursor's acknowledgement): should they fail, the
    wait's slot is given back at once rather than counted until it lapses."""
    try:
        yield
    except BaseException:
        if slot is not None:
            slot.release()
        raise


def release_connections() -> None:
    """Close this thread's database connections, so that a waiting call holds none.

    A connection inside a transaction is left alone: that only happens under the test client,
    whose test case wraps everything in one. (Under ASGI each request's sync code runs in a thread
    of its own, so a connection kept open here would not be reused by anyone anyway.)
    """
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


class Doorbell:
    """A Redis subscription to wake-up channels (any of them rings it); without Redis it degrades
    to plain re-checks.

    One connection per waiting call keeps it simple and isolated; Redis handles many thousands.
    """

    def __init__(self, *channels: str) -> None:
        self.channels = channels
        self.channel = ", ".join(channels)
        self.client: aioredis.Redis | None = None
        self.pubsub: Any = None

    async def __aenter__(self) -> "Doorbell":
        try:
            self.client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2)
            self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            await self.pubsub.subscribe(*self.channels)
        except (RedisError, OSError) as exc:
            logger.warning("cannot subscribe to %s, polling the database instead: %s", self.channel, exc)
            self.pubsub = None
        return self

    async def listen(self, *channels: str) -> None:
        """Subscribe to more channels too (a wait that learns what to listen for from its first write)."""
        self.channels = (*self.channels, *channels)
        self.channel = ", ".join(self.channels)
        if self.pubsub is None:
            return
        try:
            await self.pubsub.subscribe(*channels)
        except (RedisError, OSError) as exc:
            logger.warning("cannot subscribe to %s, polling the database instead: %s", self.channel, exc)
            self.pubsub = None

    async def ring_or_timeout(self, timeout: float) -> None:
        """Return when the channel rings or after timeout seconds, whichever comes first."""
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
