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


def guard_function(name: str, arg: str, sqlstate: str, message: str) -> migrations.RunPython:
    """A function `name(arg bigint)` for a write whose caller does not wait for its row count (it
    goes with the next statement: config.sql.defer): it returns the count, or fails the
    transaction with `sqlstate` when it is 0, so that the caller learns from that error that its
    write changed nothing."""
    create = f"""
CREATE OR REPLACE FUNCTION {name}({arg} bigint) RETURNS bigint AS $$
BEGIN
    IF {arg} = 0 THEN
        RAISE EXCEPTION '{message.replace("'", "''")}' USING ERRCODE = '{sqlstate}';
    END IF;
    RETURN {arg};
END;
$$ LANGUAGE plpgsql;
"""
    return run_on_postgresql(create, f"DROP FUNCTION IF EXISTS {name}(bigint);")
