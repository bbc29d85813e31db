"""How many HTTP waits (an `ask_agent` in `wait` mode, a steering long-poll) an agent and a saga
have in progress, whichever gateway holds them (the REST API, MCP): each holds a Redis connection
until it ends. Counted in Redis sorted sets with a lapse time, so that a dead web process cannot
leak slots."""

import logging
import time
import uuid
from dataclasses import dataclass

import redis
from django.conf import settings
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
    released: bool = False

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
    slot = WaitSlot(keys=keys, member=uuid.uuid4().hex)
    now = time.time()
    lapse = max(settings.AGORA_MAX_WAIT_S, settings.AGORA_STEERING_POLL_MAX_S) + 60
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
