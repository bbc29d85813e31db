"""Shared fixtures. The cast: alice owns sagas, bob collaborates, mallory is an outsider."""

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import kombu.pools
import pytest
from channels.layers import channel_layers
from django.conf import LazySettings
from django.db import connection
from redis import Redis

from accounts.models import User
from config.celery import app as celery_app
from config.settings import caches_for, channel_layers_for
from tests.support import CeleryWorker, RedisServer, WebServer

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


TRUNCATE_EXEMPTION = "agora.allow_journal_truncate"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """On PostgreSQL the journal refuses TRUNCATE (journal/migrations/0004_refuse_truncate.py), and
    Django empties a test database between transactional tests with TRUNCATE: the test database,
    and it alone, carries the documented exemption as a default of every session (ALTER DATABASE),
    and this connection sets it at once. Tests of the refusal turn it off for their transaction."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            name = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"ALTER DATABASE {name} SET {TRUNCATE_EXEMPTION} = 'on'")
            cursor.execute(f"SET {TRUNCATE_EXEMPTION} = 'on'")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(base URL, number of databases): REDIS_URL's server when set (as in production), else our own."""
    if url := os.environ.get("REDIS_URL"):
        parts = urlsplit(url)
        yield urlunsplit((parts.scheme, parts.netloc, "", "", "")), 16
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.base_url, server.databases
    server.stop()


_db_numbers = itertools.count()


def database_numbers(databases: int) -> list[int]:
    """This test process's share of the server's databases (0 is left alone); parallel test
    processes (pytest-xdist) sharing one REDIS_URL never use the same database."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return list(range(1 + index, databases, count))


@pytest.fixture(autouse=True)
def redis_url(redis_server: tuple[str, int], settings: LazySettings) -> Iterator[str]:
    """Each test gets its own, empty Redis database, used by Celery, Channels, the wake-ups and the cache."""
    base, databases = redis_server
    mine = database_numbers(databases)
    url = f"{base}/{mine[next(_db_numbers) % len(mine)]}"
    with Redis.from_url(url) as client:
        client.flushdb()
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = channel_layers_for(url)
    settings.CACHES = caches_for(url)  # throttle counters: per test, like everything else in Redis
    channel_layers.backends.clear()
    use_broker(url)
    yield url
    channel_layers.backends.clear()


def use_broker(url: str) -> None:
    # Celery builds its connection and producer pools lazily from broker_url; drop them so the
    # next send connects to this test's database. The pools live in kombu's registries keyed by
    # URL, so clear those too: a closed pool left there is handed back ("Acquire on closed pool")
    # when a later test gets the same database number, as it does on a 16-database REDIS_URL.
    app: Any = celery_app
    app.conf.broker_url = url
    kombu.pools.reset()
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    path = ARTIFACTS / request.node.name.replace("/", "_")[:120]
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def celery_worker(transactional_db: None, redis_url: str, artifacts: Path) -> Iterator[CeleryWorker]:
    """A real Celery worker process sharing the test database and this test's Redis database."""
    worker = CeleryWorker(redis_url, artifacts)
    yield worker
    worker.kill()  # its work is over: no need to wait for a warm shutdown


@pytest.fixture
def web_server(transactional_db: None, redis_url: str, artifacts: Path) -> Iterator[WebServer]:
    server = WebServer(redis_url, artifacts)
    yield server
    server.stop()


def make_user(username: str, **extra: Any) -> User:
    return User.objects.create_user(username=username, password=f"{username}-password", **extra)


@pytest.fixture
def alice(db: None) -> User:
    return make_user("alice")


@pytest.fixture
def bob(db: None) -> User:
    return make_user("bob")


@pytest.fixture
def mallory(db: None) -> User:
    return make_user("mallory")
