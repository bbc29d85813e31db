"""The web process lends its requests pooled PostgreSQL connections (config/web.py): a request gets
a session an earlier one handed back, with the statements it prepared, instead of opening one."""

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection
from psycopg import pq

from config.postgresql.base import DatabaseWrapper
from config.postgresql.pool import pool_connections
from tests.config.test_postgresql_batching import fresh


def pooled_options(engine: str, most: int) -> dict[str, Any]:
    database: dict[str, Any] = {"ENGINE": engine, "OPTIONS": {"connect_timeout": 3}}
    pool_connections(database, most)
    return database["OPTIONS"]


def test_only_postgresql_connections_are_pooled_and_only_when_asked() -> None:
    pooled = pooled_options("config.postgresql", 7)
    assert pooled["pool"] == {"min_size": 1, "max_size": 7, "timeout": 3.0}  # a request waits as for a new connection
    assert "pool" not in pooled_options("config.postgresql", 0)
    assert "pool" not in pooled_options("config.sqlite", 7)


def pooled_wrapper(connect_timeout: int = 5, **settings: Any) -> DatabaseWrapper:
    """This database behind a pool of one connection, as pool_connections() sets it up (at most
    one, so that each request must get the session the one before handed back)."""
    database = {**connection.settings_dict, **settings}
    options = {k: v for k, v in connection.settings_dict["OPTIONS"].items() if k != "pool"}
    database["OPTIONS"] = {**options, "connect_timeout": connect_timeout}
    pool_connections(database, 1)
    return DatabaseWrapper(database, alias="pooled")


@pytest.fixture
def pooled() -> Iterator[DatabaseWrapper]:
    wrapper = pooled_wrapper()
    try:
        yield wrapper
    finally:
        wrapper.close()
        wrapper.close_pool()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's")
@pytest.mark.django_db(transaction=True)
def test_a_request_gets_the_session_the_last_one_handed_back_with_its_prepared_statements(
    pooled: DatabaseWrapper,
) -> None:
    statement = fresh("SELECT pg_backend_pid() + %s")
    sessions, names = [], []
    for _ in range(3):  # three requests: each connects, runs the statement, hands the connection back
        with pooled.cursor() as cursor:
            cursor.execute(statement, [0])
            sessions.append(cursor.fetchone()[0])
            names.append(pooled.connection.agora_prepared[statement])
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE strpos(statement, %s) > 0",
                [statement.rsplit("/*", 1)[1]],
            )
            assert cursor.fetchone() == (1,)  # prepared once, on the first request only
        pooled.close()
        assert pooled.connection is None  # handed back to the pool, not closed
    assert len(set(sessions)) == 1 and len(set(names)) == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's")
@pytest.mark.django_db(transaction=True)
def test_what_a_request_left_unsent_is_not_sent_for_the_next(pooled: DatabaseWrapper) -> None:
    pooled.ensure_connection()
    pooled.set_autocommit(False)  # a transaction whose BEGIN and deferred write wait for a statement
    pooled.defer("SELECT 1 / 0", [])
    pooled.close()  # the request ends without it: nothing went to the server
    with pooled.cursor() as cursor:
        cursor.execute(fresh("SELECT %s::int"), [5])
        assert cursor.fetchone() == (5,)
        assert pooled.connection.info.transaction_status == pq.TransactionStatus.IDLE


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's")
@pytest.mark.django_db(transaction=True)
def test_a_request_fails_within_the_connect_timeout_when_the_database_is_silent() -> None:
    """As without the pool (tests/config/test_health.py): the request gets its error in seconds."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel completes the handshakes; nobody ever reads or writes
    silent = pooled_wrapper(connect_timeout=2, HOST="127.0.0.1", PORT=str(listener.getsockname()[1]))
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError):
            silent.ensure_connection()
        assert time.monotonic() - started < 2 + 5
    finally:
        silent.close_pool()
        listener.close()
