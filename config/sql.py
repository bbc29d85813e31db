"""For the few hot statements written as plain SQL: values as the database takes them."""

from typing import Any

from django.db import connection, models


def db_value(model: type[models.Model], field: str, value: Any) -> Any:
    """`value` prepared for `model.field` on this connection (JSON, datetimes, UUIDs...)."""
    return model._meta.get_field(field).get_db_prep_value(value, connection)  # type: ignore[union-attr]
