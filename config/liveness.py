"""Which Celery workers are alive, without asking them: each worker's main loop writes its node name
with Redis's clock into one sorted set every BEAT_S seconds, and `/healthz` and `/metrics` count
the entries younger than ALIVE_S with one Redis command. A broadcast ping per probe would wait up
to its timeout for the replies, longer under load, and cost every worker a message.

The beat runs on the worker's own timer (a consumer bootstep, registered in config/celery.py), in
the loop that takes messages: a worker whose loop is stuck stops beating, as it would stop
answering a ping. A worker that stops cleanly removes its entry; a killed one ages out.
"""

import contextlib
from typing import Any

from celery import bootsteps
from django.conf import settings
from redis import Redis
from redis.exceptions import RedisError

KEY = "agora:workers"
BEAT_S = 2.0
ALIVE_S = 10.0  # five beats: a loop busy for a moment is not reported dead
TIMEOUT_S = 1.0  # every call here is bounded: a probe answers within about this long

# Redis's clock for every host: worker and web machines need not agree on the time.
BEAT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 10 * tonumber(ARGV[2]))
return 1
"""
COUNT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
return redis.call('ZCOUNT', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""

_clients: dict[str, Redis] = {}


def client(url: str | None = None) -> Redis:
    """One client (and connection pool) per Redis URL and process, with short timeouts."""
    url = url or settings.REDIS_URL
    if url not in _clients:
        _clients[url] = Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    return _clients[url]


def beat(node: str) -> None:
    client().eval(BEAT_SCRIPT, 1, KEY, node, str(ALIVE_S))


def forget(node: str) -> None:
    client().zrem(KEY, node)


def live_workers() -> int:
    """How many workers beat within ALIVE_S. RedisError (or OSError) when Redis does not answer."""
    return int(client().eval(COUNT_SCRIPT, 1, KEY, str(ALIVE_S)))


class WorkerBeat(bootsteps.StartStopStep):
    """A consumer bootstep: started with the consumer (again after a broker reconnection)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.tref: Any = None

    def start(self, parent: Any) -> None:
        self.node = parent.hostname
        self.ring()  # at once: a worker is reported alive as soon as it takes messages
        self.tref = parent.timer.call_repeatedly(BEAT_S, self.ring, priority=10)

    def ring(self) -> None:
        with contextlib.suppress(RedisError, OSError):  # the broker's own errors say it; the entry ages out
            beat(self.node)

    def stop(self, parent: Any) -> None:
        """On a clean stop (and before a reconnection, after which start() beats again)."""
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        with contextlib.suppress(RedisError, OSError):  # it ages out
            forget(parent.hostname)

    terminate = stop
