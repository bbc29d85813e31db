"""The baseline of bench/ask_agent_rtt.py: a bare Celery two-hop round trip, no Django, no database.

The caller sends `bench.hop1`; it sends `bench.hop2` by name (as Agora rings a turn); `hop2` pushes
the caller's token and its own clock to a Redis list the caller waits on. The app is configured
like Agora's (acks_late, prefetch 1, JSON, no result backend), so the difference between the two
round trips is Agora's own work.

    python -m celery -A bench.bare_celery worker   # with BENCH_BARE_REDIS_URL set
"""

import json
import os
import time

from celery import Celery
from redis import Redis

app = Celery("bench_bare", broker=os.environ.get("BENCH_BARE_REDIS_URL", "redis://127.0.0.1:6379/1"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 600},
)

_redis: dict[str, Redis] = {}


def redis_client() -> Redis:
    url = app.conf.broker_url
    if url not in _redis:
        _redis[url] = Redis.from_url(url)
    return _redis[url]


@app.task(name="bench.hop1")
def hop1(reply_to: str, token: str) -> None:
    app.send_task("bench.hop2", args=[reply_to, token])


@app.task(name="bench.hop2")
def hop2(reply_to: str, token: str) -> None:
    redis_client().rpush(reply_to, json.dumps([token, time.time()]))
