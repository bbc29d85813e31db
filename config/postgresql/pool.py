"""The web process's pool of PostgreSQL connections (config/web.py sets it up before Django starts).

Under ASGI each request's synchronous code runs in a thread of its own, so a connection kept open
after a request (CONN_MAX_AGE) would serve nobody: each request opened one, about 3 ms on a local
server, and prepared its statements again (base.py). With the pool (psycopg_pool, through Django's
`pool` option) requests borrow connections and hand them back when they end, or when they start to
wait (sagas/waits.py), prepared statements and all; a connection is checked before it is lent
(CONN_HEALTH_CHECKS). At most `AGORA_DB_POOL_MAX` are open. A request waits for a connection as
long as it would for a new one (`connect_timeout`, AGORA_DB_CONNECT_TIMEOUT_S), then fails: when
all of them are lent, or when the database does not answer (the pool then keeps trying to connect
in the background).

Only the web process pools: a Celery worker forks its pool processes, whose copies of a pool's
threads and sockets would not work, and each of them keeps its one connection between tasks anyway.
"""

from typing import Any

from django.conf import settings


def pool_connections(database: dict[str, Any] | None = None, most: int | None = None) -> None:
    """Pool `database`'s connections (the settings' default one), `most` at most (AGORA_DB_POOL_MAX)."""
    database = settings.DATABASES["default"] if database is None else database
    most = settings.AGORA_DB_POOL_MAX if most is None else most
    if database["ENGINE"] == "config.postgresql" and most > 0:
        options = database.setdefault("OPTIONS", {})
        options["pool"] = {"min_size": 1, "max_size": most, "timeout": float(options.get("connect_timeout", 5))}
