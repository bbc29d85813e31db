"""Django's PostgreSQL backend, with the statements whose answer nobody waits for sent together
with the next one: one round trip to the server where there were several.

Each statement sent on its own costs a round trip: a message to the server, and waiting for its
answer. psycopg opens a transaction with a BEGIN of its own, Django brackets every nested atomic
block with SAVEPOINT and RELEASE SAVEPOINT, and a turn ends its transactions with an INSERT whose
result it does not read: on a busy machine each of these waits for the server as long as a real
statement. Here they wait in `pending` on the connection, and go in the same message as the next
statement (`BEGIN; SAVEPOINT s1; SELECT ...`) or as the COMMIT: the simple query protocol of
client-side binding (Django's default) runs several statements in one round trip, in order, and
the cursor then holds the last one's result. The server runs the same statements in the same
order; only their grouping into messages changes. So:
- the driver stays in autocommit mode: BEGIN goes with the first statement of a transaction (none
  is sent for a transaction in which nothing runs, nor its COMMIT);
- a savepoint released or rolled back before any statement ran in it costs nothing (released, what
  was deferred in it stays, the enclosing block's now); rolling back to a savepoint drops what is
  pending after it (it was all inside it);
- `defer()` queues a write whose outcome the caller does not wait for (no row count; the rows it
  returns, if any, go to its `then` once its message has gone: a journal event's id and seq). It
  fails, if at all, at the next statement or at COMMIT, still inside the transaction, which then
  rolls back whole: use it only where a failure fails the transaction anyway.

A transaction may also end without waiting for its COMMIT's answer (`commit_unawaited()`): the
message goes, and the answer is read before anything else uses the connection, or where the
caller says it must be in (`await_commit()`: before a model call leaves the process). Its
on-commit hooks run then, once the COMMIT is known to have gone through; if it did not, the error
is raised there, and the hooks never run. A turn does this before its model call: the call's
Python overlaps the COMMIT's round trip, and nothing outside the process sees the call before the
COMMIT is in.

The hot paths' statements (`config.sql.Statement`: those of config/sql.py's helpers and the
`*_SQL` constants marked with `prepared()`) are also prepared, once per connection: the server
plans a statement each time it is sent as text, which costs it several times what running one
of these short statements does. The first time, `PREPARE agora_N AS ...` goes in the same message
as the statement's `EXECUTE agora_N(...)`, whose arguments are the literals client-side binding
made of the parameters; from then on only the `EXECUTE`. A prepared statement is the session's,
not the transaction's: a rollback keeps it. One is known only once the message that made it has
gone through; a message that fails forgets the ones it carried (their next use prepares them
again, under a new name). Types are the server's to infer from where each parameter stands, as
for `EXPLAIN` (tests/config/test_statements.py prepares every `*_SQL` constant).

OPTIONS `prepared_statements` False (`AGORA_PG_PREPARE=0`) prepares none, for a pooler in
transaction mode. With server-side binding (OPTIONS `server_side_binding`) every statement goes on
its own, as in Django's backend, and none is prepared here.
"""

import logging
import re
from collections.abc import Callable
from functools import lru_cache
from itertools import count
from typing import Any

from django.db.backends.postgresql import base as django_base
from django.db.backends.utils import debug_transaction
from psycopg import IsolationLevel, adapt, errors, generators, pq

from config.sql import Statement, placeholders

base: Any = django_base  # its stubs describe little of it

logger = logging.getLogger(__name__)
IDLE = pq.TransactionStatus.IDLE
PREPARED_MAX = 500  # per connection; past it, statements go as text
_names = count(1)  # names are never reused: one whose PREPARE may have failed is not taken again


@lru_cache(maxsize=1024)
def numbered(query: str) -> tuple[str, int] | None:
    """`query` with its `%s` placeholders as `$1`, `$2`... and its `%%` as `%`, and how many
    parameters it takes; None for a query with any other `%` (named placeholders)."""
    n = 0

    def number(match: re.Match[str]) -> str:
        nonlocal n
        if match.group(1) == "%":
            return "%"
        n += 1
        return f"${n}"

    if "%" in _PLACEHOLDER.sub("", query):
        return None
    return _PLACEHOLDER.sub(number, query), n


_PLACEHOLDER = re.compile(r"%([s%])")


def as_prepared(conn: Any, query: Statement, params: Any) -> str:
    """What to send for `query` with `params`: `EXECUTE name(%s, ...)`, its `PREPARE` queued
    before it the first time; `query` itself when it cannot be (no room, or placeholders that do
    not match the parameters)."""
    prepared: dict[str, str] | None = conn.agora_prepared
    if prepared is None:
        return query
    name = prepared.get(query) or conn.agora_preparing.get(query)
    if name is None:
        shape = numbered(query)
        if shape is None or shape[1] != len(params) or len(prepared) >= PREPARED_MAX:
            return query
        name = f"agora_{next(_names)}"
        conn.agora_pending.append(f"PREPARE {name} AS {shape[0]}")
        conn.agora_preparing[query] = name
    return f"EXECUTE {name}({placeholders(len(params))})" if params else f"EXECUTE {name}"


def settled(conn: Any, *, sent: bool) -> None:
    """After a message went out with what was pending: the statements it prepared are known from
    now on, if it went through."""
    if sent and conn.agora_preparing:
        conn.agora_prepared.update(conn.agora_preparing)
    conn.agora_preparing = {}


def lead(conn: Any) -> list[str]:
    """The statements to send before the next one on `conn` (and forget): the BEGIN of the
    transaction Django opened, if it has not begun, and whatever is pending. A COMMIT still on its
    way is awaited first."""
    settle(conn)
    begin: str = getattr(conn, "agora_begin", "")
    pending: list[str] = getattr(conn, "agora_pending", [])
    statements = [begin] if begin and conn.info.transaction_status == IDLE else []
    if pending:
        statements += pending
        conn.agora_pending = []
    return statements


class Read(str):
    """A deferred statement whose rows somebody reads, once its message has gone: `then(rows)`."""

    then: Callable[[list[tuple[Any, ...]]], None]


def deliver(cursor: Any, before: list[str]) -> None:
    """After a message went: each deferred read gets its rows, and the cursor moves on, result by
    result, past the statements that went before the last one."""
    for statement in before:
        if isinstance(statement, Read):
            statement.then(cursor.fetchall())
        cursor.nextset()


class Cursor(base.Cursor):
    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self.connection
        if isinstance(query, Statement) and isinstance(params, list | tuple) and not kwargs:
            query = as_prepared(conn, query, params)
        before = lead(conn)
        if not before:
            return super().execute(query, params, **kwargs)
        if not isinstance(query, str) or kwargs:  # a composed query goes on its own
            send(conn, before)
            return super().execute(query, params, **kwargs)
        # The statements before it are bound already: so is it, and the message goes without
        # parameters (the driver then parses none of it for placeholders).
        bound = query if params is None else self.mogrify(query, params)
        try:
            super().execute("; ".join([*before, bound]))
        except BaseException:
            settled(conn, sent=False)
            raise
        settled(conn, sent=True)
        deliver(self, before)  # to the result of `query`
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        if before := lead(self.connection):
            send(self.connection, before)
        return super().executemany(query, params_seq, **kwargs)


def send(conn: Any, before: list[str], *after: str) -> None:
    """Send what was pending, on its own (with `after`: the COMMIT)."""
    cursor = base.Cursor(conn)
    try:
        cursor.execute("; ".join([*before, *after]))
    except BaseException:
        settled(conn, sent=False)
        raise
    settled(conn, sent=True)
    deliver(cursor, before)


def send_unawaited(conn: Any, before: list[str], hooks: list[Any]) -> None:
    """Send what was pending with the COMMIT, and go on: settle() reads the answer."""
    with conn.lock:
        conn.pgconn.send_query("; ".join([*before, "COMMIT"]).encode(conn.info.encoding))
        conn.wait(generators.send(conn.pgconn))
    conn.agora_unawaited = (before, hooks)


def settle(conn: Any) -> None:
    """The answer to a COMMIT sent without waiting, if one is on its way: each deferred read gets
    its rows, then the transaction's on-commit hooks run (Django's, held back: robust ones log
    their errors). A failed message raises its error, and its hooks never run."""
    unawaited = getattr(conn, "agora_unawaited", None)
    if unawaited is None:
        return
    conn.agora_unawaited = None
    before, hooks = unawaited
    with conn.lock:
        results = conn.wait(generators.fetch_many(conn.pgconn))
    if failed := next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None):
        settled(conn, sent=False)
        if conn.info.transaction_status != IDLE:  # the server skipped the rest of the message, COMMIT included
            base.Cursor(conn).execute("ROLLBACK")
        raise errors.error_from_result(failed, encoding=conn.info.encoding)
    settled(conn, sent=True)
    # The results as a cursor holds them after a message it sent (psycopg's own steps; pinned).
    cursor = base.Cursor(conn)
    cursor._tx = adapt.Transformer(cursor)
    cursor._set_results(results)
    deliver(cursor, before)
    for _, hook, robust in hooks:
        try:
            hook()
        except Exception:
            if not robust:
                raise
            logger.exception("on-commit hook %s failed", getattr(hook, "__qualname__", hook))


def unsent(conn: Any) -> None:
    """Nothing waits on `conn`: no BEGIN, no deferred statement, no PREPARE."""
    conn.agora_begin, conn.agora_pending = "", []
    conn.agora_preparing = {}  # by query, the name of its prepared statement whose PREPARE waits in `pending`
    conn.agora_unawaited = None  # a COMMIT sent without waiting: what it carried, and the hooks after it


class DatabaseWrapper(base.DatabaseWrapper):
    agora_commit_unawaited = False  # set by commit_unawaited(), taken by the next _commit()

    def get_connection_params(self) -> dict[str, Any]:
        options = self.settings_dict["OPTIONS"]
        # Off where a session may not keep its prepared statements (a pooler in transaction mode).
        prepare = options.get("prepared_statements", True)
        self.settings_dict["OPTIONS"] = {k: v for k, v in options.items() if k != "prepared_statements"}
        try:
            params: dict[str, Any] = super().get_connection_params()
        finally:
            self.settings_dict["OPTIONS"] = options
        if params["cursor_factory"] is base.Cursor:  # not with server-side binding
            params["cursor_factory"] = Cursor
            if prepare:
                # The prepared statements are lookups by key: one generic plan, made at the first
                # EXECUTE, serves them all. By default the server would plan each one's first five
                # executions again on every new connection (the join that reads a claimed run takes
                # it a few milliseconds each time), and plan afresh forever one whose generic plan
                # it happens to estimate dearer.
                params["options"] = f"{params.get('options', '')} -c plan_cache_mode=force_generic_plan".lstrip()
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        conn = super().get_new_connection(conn_params)
        if not hasattr(conn, "agora_prepared"):  # a new session; one a pool lends again was reset when handed back
            unsent(conn)
            prepare = self.settings_dict["OPTIONS"].get("prepared_statements", True)
            conn.agora_prepared = {} if prepare else None  # by query, the name of its prepared statement
            # Binds deferred statements' parameters and never runs one: one per connection keeps its
            # adapters between statements, where a cursor for each would look them up again.
            conn.agora_binder = base.Cursor(conn)
        return conn

    def _close(self) -> Any:
        if self.connection is not None:
            try:
                settle(self.connection)  # its hooks run: the COMMIT went before the close
            except Exception:
                logger.exception("a COMMIT sent without waiting failed; the connection closes")
            if self.pool:  # handed back: what waits for a statement never goes
                unsent(self.connection)
        return super()._close()

    @property
    def batches(self) -> bool:
        return self.connection is not None and self.connection.cursor_factory is Cursor

    def _set_autocommit(self, autocommit: bool) -> None:
        if not self.batches:
            super()._set_autocommit(autocommit)
            return
        conn = self.connection
        if not conn.autocommit:  # as connected
            conn.autocommit = True
        begin = "BEGIN"
        if conn.isolation_level is not None:  # set from OPTIONS
            begin += " ISOLATION LEVEL " + IsolationLevel(conn.isolation_level).name.replace("_", " ")
        conn.agora_begin = "" if autocommit else begin
        conn.agora_pending = []

    def _savepoint(self, sid: str) -> None:
        if not self.batches:
            return super()._savepoint(sid)
        self.connection.agora_pending.append(self.ops.savepoint_create_sql(sid))

    def _savepoint_commit(self, sid: str) -> None:
        if not self.batches:
            return super()._savepoint_commit(sid)
        if (at := self.unsent(sid)) is not None:  # never sent: nothing to release, and what was
            del self.connection.agora_pending[at]  # deferred in it is now the enclosing block's
        else:
            self.connection.agora_pending.append(self.ops.savepoint_commit_sql(sid))

    def _savepoint_rollback(self, sid: str) -> None:
        if not self.batches:
            return super()._savepoint_rollback(sid)
        conn = self.connection
        if (at := self.unsent(sid)) is not None:  # what followed it is dropped; it stays, unsent
            del conn.agora_pending[at + 1 :]
            kept = {s.split(" ", 2)[1] for s in conn.agora_pending if s.startswith("PREPARE ")}
            conn.agora_preparing = {q: name for q, name in conn.agora_preparing.items() if name in kept}
        else:
            conn.agora_pending = []  # all of it came after the savepoint
            settled(conn, sent=False)
            super()._savepoint_rollback(sid)

    def unsent(self, sid: str) -> int | None:
        """Where the savepoint `sid` waits in `pending`, if it has not been sent yet."""
        pending: list[str] = self.connection.agora_pending
        created = self.ops.savepoint_create_sql(sid)
        return pending.index(created) if created in pending else None

    def _commit(self) -> Any:
        unawaited, self.agora_commit_unawaited = self.agora_commit_unawaited, False
        if self.batches:
            # Deferred writes go in one message with the COMMIT; it releases the savepoints.
            with self.wrap_database_errors:
                before = [s for s in lead(self.connection) if not s.startswith(("SAVEPOINT", "RELEASE"))]
                begun = self.connection.info.transaction_status != IDLE
                if unawaited and (begun or any(not s.startswith("BEGIN") for s in before)):
                    wrapper: Any = self  # Django's attributes, which its stubs leave untyped
                    hooks, wrapper.run_on_commit = wrapper.run_on_commit, []  # they run once it is in: settle()
                    with debug_transaction(self, "COMMIT"):  # in the query log, as Django's own COMMIT
                        send_unawaited(self.connection, before, hooks)
                    return None
                if any(not s.startswith("BEGIN") for s in before):
                    send(self.connection, before, "COMMIT")
            settled(self.connection, sent=False)  # when nothing went: nothing was prepared
        return super()._commit()  # psycopg sends nothing when that COMMIT went, or nothing began

    def commit_unawaited(self) -> None:
        """End the transaction in progress without waiting for its COMMIT's answer (see the module's
        docstring); outside one, or where nothing is batched, nothing changes."""
        if self.batches and not self.get_autocommit():
            self.agora_commit_unawaited = True

    def await_commit(self) -> None:
        """Wait for the answer to a COMMIT sent without waiting, if one is on its way."""
        if self.batches and self.connection is not None:
            with self.wrap_database_errors:
                settle(self.connection)

    def _rollback(self) -> Any:
        if self.batches and self.connection is not None:
            self.agora_commit_unawaited = False
            with self.wrap_database_errors:
                settle(self.connection)  # an earlier transaction's: its hooks are not this one's
            self.connection.agora_pending = []
            settled(self.connection, sent=False)
        return super()._rollback()

    def create_cursor(self, name: str | None = None) -> Any:
        if name and self.batches and (before := lead(self.connection)):
            send(self.connection, before)  # a named cursor's DECLARE comes after them
        return super().create_cursor(name)

    def flush(self) -> None:
        """Send what waits on the connection now: the rows a deferred read waits for come back."""
        if self.batches and self.connection is not None and self.connection.agora_pending:
            with self.wrap_database_errors:
                send(self.connection, lead(self.connection))

    def defer(self, sql: str, params: Any, then: Callable[[list[tuple[Any, ...]]], None] | None = None) -> None:
        """Run a write whose outcome nobody waits for with the next statement or the COMMIT; at once
        where that cannot be (outside a transaction, or with server-side binding). `then` gets the
        rows it returns, once they come back (in the same transaction, before anything after it)."""
        if self.batches and not self.get_autocommit():
            conn = self.connection
            if isinstance(sql, Statement) and isinstance(params, list | tuple):
                sql = as_prepared(conn, sql, params)
            text = base.Cursor.mogrify(conn.agora_binder, sql, params)
            if then is not None:
                text = Read(text)
                text.then = then
            conn.agora_pending.append(text)
            return
        with self.cursor() as cursor:
            cursor.execute(sql, params)
            if then is not None:
                then(cursor.fetchall())
