"""The web process lends its requests pooled PostgreSQL connections (config/web.py): a request gets
a session an earlier one handed back, with the statements it prepared, instead of opening one."""

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from psycopg import pq

from config.postgresql.base import DatabaseWrapper
from config.postgresql.pool import POOL_WAIT_S, pool_connections
from tests.config.test_postgresql_batching import fresh


def pooled_options(engine: str, most: int) -> dict[str, Any]:
    database: dict[str, Any] = {"ENGINE": engine, "OPTIONS": {}}
    pool_connections(database, most)
    return database["OPTIONS"]


def test_only_postgresql_connections_are_pooled_and_only_when_asked() -> None:
    assert pooled_options("config.postgresql", 7) == {"pool": {"min_size": 1, "max_size": 7, "timeout": POOL_WAIT_S}}
    assert pooled_options("config.postgresql", 0) == {}
    assert pooled_options("config.sqlite", 7) == {}


@pytest.fixture
def pooled() -> Iterator[DatabaseWrapper]:
    """This database behind a pool of one connection, as the web process has it (at most one, so
    that each request must get the session the one before handed back)."""
    options = {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1, "timeout": 5}}
    wrapper = DatabaseWrapper({**connection.settings_dict, "OPTIONS": options}, alias="pooled")
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
