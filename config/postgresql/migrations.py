"""What a migration runs on PostgreSQL only: the functions and triggers with which the database
itself holds an invariant (SQLite has no PL/pgSQL; there the code holds it)."""

from typing import Any

from django.db import migrations


def run_on_postgresql(create: str, drop: str) -> migrations.RunPython:
    """An operation that runs `create`, or `drop` when it is unapplied, on PostgreSQL only."""

    def run(sql: str) -> Any:
        def apply(apps: Any, schema_editor: Any) -> None:
            if schema_editor.connection.vendor == "postgresql":
                # No params: with params psycopg would read the '%' in RAISE's format as a placeholder.
                schema_editor.execute(sql, params=None)

        return apply

    return migrations.RunPython(run(create), run(drop))
