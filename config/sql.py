"""Helpers for the hot paths: plain INSERTs and UPDATEs, and plain SELECTs that load model instances.

Building a statement costs the ORM several times what running it costs SQLite. The statements an
agent turn runs every time (journal events, steering, requests, runs, transcript entries) are
written out once, as module constants, and use these to turn values and rows into model instances.
They are `Statement`s: on PostgreSQL each is prepared once per connection (config/postgresql/).
"""

import re
from collections.abc import Callable, Sequence
from functools import cache, lru_cache, partial
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.constants import OnConflict

M = TypeVar("M", bound=models.Model)


class Statement(str):
    """A statement of the hot paths, with `%s` placeholders whose types the database infers from
    where they stand: PostgreSQL prepares it once per connection. The helpers here mark what they
    run; a `*_SQL` constant run through a cursor of its own is marked with prepared()."""


def prepared(sql: str) -> Statement:
    return Statement(sql)


def placeholders(n: int) -> str:
    """`%s, %s, ...`, n of them: the values of an IN list or a row."""
    return ", ".join(["%s"] * n)


def literals(values: Sequence[str]) -> str:
    """`'a', 'b', ...`: constants of the code (a model's choices), written into a statement rather
    than bound, where the planner of a prepared statement needs them to choose an index (a
    partial one, or one whose column holds them rarely). Only plain words."""
    assert all(re.fullmatch(r"[a-z_]+", v) for v in values), values
    return ", ".join(f"'{v}'" for v in values)


def db() -> BaseDatabaseWrapper:
    """This thread's connection. Every attribute read through `django.db.connection` looks the
    connection up again (a context-local lookup): the helpers here look it up once per call."""
    return connections[DEFAULT_DB_ALIAS]


def db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """`value` prepared for `model.field` on this connection (JSON, datetimes, UUIDs...)."""
    return model._meta.get_field(field).get_db_prep_save(value, db())  # type: ignore[union-attr]


def py_value(model: type[models.Model], field: str, value: Any) -> Any:
    """The inverse of db_value(): a value as this connection read it from model.field's column."""
    conn = db()
    read = readers(model, conn)[field]
    return value if read is None or value is None else read(value)


Reader = Callable[[Any], Any]


@lru_cache(maxsize=512)
def readers(model: type[models.Model], conn: BaseDatabaseWrapper) -> dict[str, Reader | None]:
    """Per field, what the ORM applies to a value it reads from its column on this connection:
    the backend's converters (SQLite's datetimes, booleans, UUIDs), then the field's own (JSON).
    None: nothing to do."""
    result: dict[str, Reader | None] = {}
    for f in model._meta.concrete_fields:
        col = f.get_col(model._meta.db_table)  # a foreign key's reads as the field it points to
        converters = (*conn.ops.get_db_converters(col), *col.get_db_converters(conn))
        result[f.name] = partial(_convert, converters, col, conn) if converters else None
    return result


def _convert(converters: tuple[Any, ...], col: Any, conn: BaseDatabaseWrapper, value: Any) -> Any:
    for convert in converters:
        value = convert(value, col, conn)
    return value


def columns(model: type[models.Model], alias: str) -> str:
    """The select list of model's concrete fields, in the order load() takes them."""
    return ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)


def load(model: type[M], values: Sequence[Any], conn: BaseDatabaseWrapper | None = None) -> M:
    """An instance from one row's values of columns(model), as the ORM would make it."""
    conn = conn or db()
    fields = model._meta.concrete_fields
    read = readers(model, conn)
    row = [
        value if value is None or (r := read[f.name]) is None else r(value)
        for f, value in zip(fields, values, strict=True)
    ]
    return model.from_db(conn.alias, [f.attname for f in fields], row)


def fetch(sql: str, params: Sequence[Any], *shape: type[models.Model], plain: int = 0) -> list[list[Any]]:
    """Run a SELECT of columns(...) of each model of `shape` in turn, and load each row as one
    instance per model; None for a model an outer join found no row of (a NULL primary key). With
    `plain`, the select list starts with that many other values, which lead each row as read; the
    values after the models' columns, if any, end it as read."""
    with db().cursor() as cursor:
        cursor.execute(Statement(sql), params)
        return loaded(cursor.fetchall(), shape, plain)


def fetch_later(sql: str, params: Sequence[Any], *shape: type[models.Model]) -> Callable[[], list[list[Any]]]:
    """fetch() deferred as rows_later() defers: the rows are loaded when asked for."""
    rows = rows_later(sql, params)
    return lambda: loaded(rows(), shape)


def loaded(rows: Sequence[Sequence[Any]], shape: Sequence[type[models.Model]], plain: int = 0) -> list[list[Any]]:
    """The rows of a fetch() statement, loaded as fetch() loads them."""
    spans, start = [], plain
    for model in shape:
        fields = model._meta.concrete_fields
        spans.append((model, start, start + len(fields), start + fields.index(model._meta.pk)))
        start += len(fields)
    conn = db()
    return [
        [
            *row[:plain],
            *(None if row[pk] is None else load(model, row[a:b], conn) for model, a, b, pk in spans),
            *row[start:],
        ]
        for row in rows
    ]


def fetch_one(sql: str, params: Sequence[Any], *shape: type[models.Model], plain: int = 0) -> list[Any] | None:
    """fetch() for a lookup that finds one row or none."""
    rows = fetch(sql, params, *shape, plain=plain)
    return rows[0] if rows else None


def update(
    model: type[models.Model], where: dict[str, Any], *, later: bool = False, or_fail: str = "", **changes: Any
) -> int:
    """`model.objects.filter(**where).update(**changes)` as one plain statement, for equality (a
    list or tuple value: any of them). The number of rows it changed; with `later` it is deferred
    (defer()) and returns -1. With `or_fail`, the name of a server function of the number of rows
    changed that fails the transaction when it is 0 (a PostgreSQL migration creates it): on
    PostgreSQL the statement is deferred and returns 1, and a caller that changed nothing finds out
    from the error its transaction then raises; elsewhere it runs at once, as without."""
    meta = model._meta
    sets = [f'"{meta.get_field(name).column}" = %s' for name in changes]  # type: ignore[union-attr]
    params = [db_value(model, name, value) for name, value in changes.items()]
    conditions = []
    for name, value in where.items():
        values = value if isinstance(value, list | tuple) else [value]
        conditions.append(f'"{meta.get_field(name).column}" IN ({placeholders(len(values))})')  # type: ignore[union-attr]
        params += [db_value(model, name, v) for v in values]
    sql = Statement(f"UPDATE {meta.db_table} SET {', '.join(sets)} WHERE {' AND '.join(conditions)}")
    if or_fail and db().vendor == "postgresql":
        defer(guarded(f"{sql} RETURNING 1", or_fail), params)
        return 1
    if later:
        defer(sql, params)
        return -1
    with db().cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def guarded(write: str, guard: str) -> Statement:
    """A write with RETURNING whose row count goes to `guard`, a server function that fails the
    transaction when it is 0 (config.postgresql.migrations.guard_function): on PostgreSQL a caller
    that defers the write learns from that error, with its SQLSTATE (failed_with()), that it
    changed nothing."""
    return Statement(f"WITH changed AS ({write}) SELECT {guard}(count(*)) FROM changed")


def failed_with(exc: BaseException, sqlstate: str) -> bool:
    """Whether a database error (Django's, wrapping the driver's) carries this SQLSTATE."""
    return getattr(exc.__cause__, "sqlstate", None) == sqlstate


@cache
def insert_sql(
    model: type[models.Model], vendor: str, rows: int = 1, *, ignore_conflicts: bool = False, keyed: bool = False
) -> tuple[str, tuple[Any, ...], bool]:
    """The INSERT of `rows` rows of model's concrete fields, the fields, and whether it reads back
    the keys the database makes (unless a row in conflict is skipped: it has none; or `keyed`: the
    rows come with theirs, from keys_later())."""
    meta, ops = model._meta, db().ops
    auto_pk = isinstance(meta.pk, models.AutoField) and not keyed
    fields = tuple(f for f in meta.concrete_fields if not (auto_pk and f.primary_key))
    columns = ", ".join(ops.quote_name(str(f.column)) for f in fields)
    row = f"({placeholders(len(fields))})"
    read_keys = auto_pk and not ignore_conflicts
    if ignore_conflicts:
        start = ops.insert_statement(on_conflict=OnConflict.IGNORE)
        suffix = ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, [], [])
        end = f" {suffix}" if suffix else ""
    else:
        start, end = "INSERT INTO", f" RETURNING {meta.pk.column}" if read_keys else ""
    sql = f"{start} {meta.db_table} ({columns}) VALUES {', '.join([row] * rows)}{end}"
    return Statement(sql), fields, read_keys


def insert(instance: M, *, later: bool = False) -> M:
    """Save a new instance with one plain INSERT, as save(force_insert=True) would (defaults,
    auto_now_add), but without the ORM's compile step and signals. With `later`, deferred
    (defer()), as insert_all() defers."""
    (saved,) = insert_all([instance], later=later)
    return saved


def insert_all(instances: Sequence[M], *, ignore_conflicts: bool = False, later: bool = False) -> list[M]:
    """bulk_create() of instances of one model as one plain INSERT, without the ORM's compile
    step: the keys the database makes are set on them. With `ignore_conflicts`, a row whose unique
    key is taken is skipped (and its key is not read). With `later`, the INSERT is deferred
    (defer()), and the keys the database makes are set when its answer comes back, with the
    transaction's next statement or its COMMIT: for rows whose keys nothing reads before then. Rows
    that come with their keys (keys_later()) are inserted with them."""
    if not instances:
        return []
    conn = db()
    keyed = all(instance.pk is not None for instance in instances)
    sql, fields, read_keys = insert_sql(
        type(instances[0]), conn.vendor, len(instances), ignore_conflicts=ignore_conflicts, keyed=keyed
    )
    params = [f.get_db_prep_save(f.pre_save(instance, True), conn) for instance in instances for f in fields]

    def set_keys(rows: Sequence[tuple[Any, ...]]) -> None:
        for instance, (pk,) in zip(instances, rows, strict=True):
            instance.pk = pk

    if later:
        defer(sql, params, then=set_keys if read_keys else None)
    else:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            if read_keys:
                set_keys(cursor.fetchall())
    for instance in instances:
        instance._state.adding, instance._state.db = False, conn.alias
    return list(instances)


def flush() -> None:
    """Send the deferred statements now (on PostgreSQL; elsewhere they ran at once)."""
    if send := getattr(db(), "flush", None):
        send()


def commit_unawaited() -> None:
    """End the transaction in progress without waiting for its COMMIT's answer, on PostgreSQL
    (config/postgresql/base.py): the next statement, or await_commit(), reads it, and only then do
    the transaction's on-commit hooks run. Elsewhere, and outside a transaction, nothing changes."""
    if mark := getattr(db(), "commit_unawaited", None):
        mark()


def await_commit() -> None:
    """Wait for a COMMIT sent without waiting (commit_unawaited()), if one is on its way: before
    anything outside the process may see what follows it. Its error, if it failed, is raised here."""
    if wait := getattr(db(), "await_commit", None):
        wait()


def defer(sql: str, params: Sequence[Any], then: Callable[[list[tuple[Any, ...]]], None] | None = None) -> None:
    """Run a statement whose outcome the caller does not wait for (no row count; the rows it
    returns, if `then` wants them, come to `then` later). On PostgreSQL it goes in one message with
    the transaction's next statement or its COMMIT (config/postgresql/base.py): a failure then
    fails the transaction there, so only for writes whose failure fails the transaction anyway.
    Elsewhere it runs at once."""
    conn = db()
    if queue := getattr(conn, "defer", None):
        queue(Statement(sql), params, then)
        return
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        if then is not None:
            then(cursor.fetchall())


def rows_later(sql: str, params: Sequence[Any]) -> "RowsLater":
    """defer() a statement whose rows are read later, by calling what this returns: they come
    back with the transaction's next statement or its COMMIT, and a call before then (an
    after-commit hook run inside the transaction, as a test's captureOnCommitCallbacks does)
    sends what waits first. No rows when the statement was rolled back unsent with a savepoint."""
    rows = RowsLater()
    defer(sql, params, then=rows.answer.append)
    return rows


class RowsLater:
    """The rows of a rows_later() statement; `back`: whether the server has answered it yet."""

    def __init__(self) -> None:
        self.answer: list[list[tuple[Any, ...]]] = []

    def __call__(self) -> list[tuple[Any, ...]]:
        if not self.answer:
            flush()
        return self.answer[0] if self.answer else []

    @property
    def back(self) -> bool:
        return bool(self.answer)


def keys_later(tables: Sequence[type[models.Model]], n: int) -> Callable[[], list[tuple[int, ...]]] | None:
    """On PostgreSQL, `n` new keys from the sequence of each model's automatic key, one row per
    `n`, read with the transaction's next statement (rows_later()): rows given them are inserted
    with their keys, deferred (insert_all(later=True)), where reading the keys the database makes
    would cost a round trip for each INSERT. A key taken and not used (a rollback) is skipped, as
    by any INSERT. None elsewhere: on SQLite an INSERT costs no round trip."""
    if db().vendor != "postgresql":
        return None
    nextvals = ", ".join(
        f"nextval(pg_get_serial_sequence('{m._meta.db_table}', '{m._meta.pk.column}'))" for m in tables
    )
    return rows_later(prepared(f"SELECT {nextvals} FROM generate_series(1, %s)"), [n])


def found_later(sql: str, params: Sequence[Any]) -> Callable[[], bool]:
    """rows_later() for a compare-and-set (`UPDATE ... RETURNING`) whose one question is whether it
    found its row: a claim or a lease renewal, answered before the commit."""
    rows = rows_later(sql, params)
    return lambda: bool(rows())
