"""Helpers for the hot paths: plain INSERTs of model instances, and unique lookups without ordering.

Building a statement costs the ORM several times what running it costs SQLite. The kernel's
hottest writes (journal events, steering items, requests, transcript entries) use these instead.
"""

from functools import cache
from typing import Any, TypeVar

from django.db import connection, models

M = TypeVar("M", bound=models.Model)


def db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """`value` prepared for `model.field` on this connection (JSON, datetimes, UUIDs...)."""
    return model._meta.get_field(field).get_db_prep_save(value, connection)  # type: ignore[union-attr]


@cache
def insert_sql(model: type[models.Model], vendor: str) -> tuple[str, tuple[Any, ...], bool]:
    """The INSERT for model's concrete fields, the fields, and whether the database makes the pk."""
    meta = model._meta
    auto_pk = isinstance(meta.pk, models.AutoField)
    fields = tuple(f for f in meta.concrete_fields if not (auto_pk and f.primary_key))
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
    sql = f"INSERT INTO {meta.db_table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})"
    return (sql + f" RETURNING {meta.pk.column}" if auto_pk else sql), fields, auto_pk


def insert(instance: M) -> M:
    """Save a new instance with one plain INSERT, as save(force_insert=True) would (defaults,
    auto_now_add), but without the ORM's compile step and signals."""
    sql, fields, auto_pk = insert_sql(type(instance), connection.vendor)
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if auto_pk:
            (instance.pk,) = cursor.fetchone()
    instance._state.adding, instance._state.db = False, connection.alias
    return instance


def one(queryset: "models.QuerySet[M]") -> M | None:
    """The row a unique lookup finds, or None: unlike first(), with no ORDER BY to build and run
    (a third of the time of a small select_related lookup)."""
    return next(iter(queryset.order_by()[:1]), None)
