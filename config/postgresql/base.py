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
- a savepoint released or rolled back before any statement ran in it costs nothing; rolling back
  to a savepoint drops what is pending after it (it was all inside it);
- `defer()` queues a write whose outcome the caller does not read (no result, no row count). It
  fails, if at all, at the next statement or at COMMIT, still inside the transaction, which then
  rolls back whole: use it only where a failure fails the transaction anyway.
With server-side binding (OPTIONS `server_side_binding`) every statement goes on its own, as in
Django's backend.
"""

from typing import Any

from django.db.backends.postgresql import base as django_base
from psycopg import IsolationLevel, pq

base: Any = django_base  # its stubs describe little of it

IDLE = pq.TransactionStatus.IDLE


def lead(conn: Any) -> list[str]:
    """The statements to send before the next one on `conn` (and forget): the BEGIN of the
    transaction Django opened, if it has not begun, and whatever is pending."""
    begin: str = getattr(conn, "agora_begin", "")
    pending: list[str] = getattr(conn, "agora_pending", [])
    statements = [begin] if begin and conn.info.transaction_status == IDLE else []
    if pending:
        statements += pending
        conn.agora_pending = []
    return statements


class Cursor(base.Cursor):
    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        before = lead(self.connection)
        if not before:
            return super().execute(query, params, **kwargs)
        if not isinstance(query, str) or kwargs:  # a composed query goes on its own
            super().execute("; ".join(before))
            return super().execute(query, params, **kwargs)
        if params is not None:  # the statements before it are bound already: their % are literal
            before = [statement.replace("%", "%%") for statement in before]
        super().execute("; ".join([*before, query]), params)
        for _ in before:
            self.nextset()  # to the result of `query`
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        if before := lead(self.connection):
            super().execute("; ".join(before))
        return super().executemany(query, params_seq, **kwargs)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        if params["cursor_factory"] is base.Cursor:  # not with server-side binding
            params["cursor_factory"] = Cursor
        return params

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
        if (at := self.unsent(sid)) is not None:  # nothing ran in it: nothing to release
            del self.connection.agora_pending[at:]
        else:
            self.connection.agora_pending.append(self.ops.savepoint_commit_sql(sid))

    def _savepoint_rollback(self, sid: str) -> None:
        if not self.batches:
            return super()._savepoint_rollback(sid)
        if (at := self.unsent(sid)) is not None:  # what followed it is dropped; it stays, unsent
            del self.connection.agora_pending[at + 1 :]
        else:
            self.connection.agora_pending = []  # all of it came after the savepoint
            super()._savepoint_rollback(sid)

    def unsent(self, sid: str) -> int | None:
        """Where the savepoint `sid` waits in `pending`, if it has not been sent yet."""
        pending: list[str] = self.connection.agora_pending
        created = self.ops.savepoint_create_sql(sid)
        return pending.index(created) if created in pending else None

    def _commit(self) -> Any:
        if self.batches:
            # Deferred writes go in one message with the COMMIT; it releases the savepoints.
            before = [s for s in lead(self.connection) if not s.startswith(("SAVEPOINT", "RELEASE"))]
            if any(not s.startswith("BEGIN") for s in before):
                with self.wrap_database_errors:
                    base.Cursor(self.connection).execute("; ".join([*before, "COMMIT"]))
        return super()._commit()  # psycopg sends nothing when that COMMIT went, or nothing began

    def _rollback(self) -> Any:
        if self.batches and self.connection is not None:
            self.connection.agora_pending = []
        return super()._rollback()

    def create_cursor(self, name: str | None = None) -> Any:
        if name and self.batches and (before := lead(self.connection)):
            base.Cursor(self.connection).execute("; ".join(before))  # a named cursor's DECLARE comes after them
        return super().create_cursor(name)

    def defer(self, sql: str, params: Any) -> None:
        """Run a write whose outcome nobody reads with the next statement or the COMMIT; at once
        where that cannot be (outside a transaction, or with server-side binding)."""
        if self.batches and not self.get_autocommit():
            with self.connection.cursor() as cursor:
                self.connection.agora_pending.append(base.Cursor.mogrify(cursor, sql, params))
            return
        with self.cursor() as cursor:
            cursor.execute(sql, params)
