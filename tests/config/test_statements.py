"""Every hand-written statement (a module-level `*_SQL` constant in the apps) compiles against the
migrated schema of the database under test: SQLite here, PostgreSQL in CI's second run. A renamed
column or table fails this test, not production. New statements are found without being listed."""

import ast
import importlib
import re
from pathlib import Path

import pytest
from django.db import DatabaseError, connection

from config.postgresql.base import numbered

BASE = Path(__file__).resolve().parents[2]
APPS = ["accounts", "agents", "config", "gateways", "journal", "sagas"]
# What the statements with a part filled in at run time are completed with.
FILL = {"upto": " AND i.seq <= %s", "ids": "%s, %s", "when": "1 = 1"}
# The statements only one database runs, and which.
ONLY_ON = {
    ("sagas.actions.locking", "_LOCK_SQL"): "postgresql",  # a row lock: SQLite locks the database
    ("sagas.actions.runs", "_LOCK_RUNS_SAGA_SQL"): "postgresql",
    ("sagas.actions.runs", "_RENEW_HELD_SQL"): "postgresql",  # a data-modifying WITH and a PL/pgSQL function
    ("journal.actions", "_APPEND_WHEN_SQL"): "postgresql",  # a data-modifying WITH, which SQLite has not
    ("journal.actions", "_APPEND_SQLITE_WHEN_SQL"): "sqlite",  # one writer at a time: no head row to lock
}

pytestmark = pytest.mark.django_db


def statement_names() -> list[tuple[str, str]]:
    """(module, constant) for every module-level `*_SQL` assignment, read from the source."""
    found = []
    for app in APPS:
        for path in sorted((BASE / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            module = ".".join(path.relative_to(BASE).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text()).body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                found += [(module, t.id) for t in targets if isinstance(t, ast.Name) and t.id.endswith("_SQL")]
    return found


def runnable(sql: str) -> str:
    sql = sql.format(**FILL)
    if sql.rstrip().endswith("VALUES"):  # a multi-row INSERT gets its rows appended: give it one
        columns = re.findall(r"\(([^()]*)\)\s*VALUES\s*$", sql)[-1].split(",")
        sql += "(" + ", ".join(["%s"] * len(columns)) + ")"
    return sql


def test_the_statements_are_found() -> None:
    names = {name for _, name in statement_names()}
    assert {"_APPEND_WHEN_SQL", "_ASK_SQL", "_CLAIMED_RUN_SQL", "_INSERT_SQL", "_MAY_ADDRESS_SQL"} <= names


@pytest.mark.parametrize(("module", "name"), statement_names())
def test_each_statement_compiles_against_the_schema(module: str, name: str) -> None:
    if ONLY_ON.get((module, name), connection.vendor) != connection.vendor:
        pytest.skip(f"run on {ONLY_ON[(module, name)]} only")
    sql = runnable(getattr(importlib.import_module(module), name))
    with connection.cursor() as cursor:
        # EXPLAIN plans the statement (every table and column resolved) without running it.
        cursor.execute(f"EXPLAIN {sql}", [None] * sql.count("%s"))
        if connection.vendor == "postgresql":
            # The hot paths' statements are prepared (config/postgresql/base.py): the server must
            # infer every parameter's type from where it stands, without the literals' help.
            shape = numbered(sql)
            assert shape is not None, sql
            cursor.execute(f"PREPARE statement_probe AS {shape[0]}")
            cursor.execute("DEALLOCATE statement_probe")


def test_a_renamed_column_fails() -> None:
    from sagas.actions.requests import _ASK_SQL

    broken = _ASK_SQL.replace("recipient_id", "addressee_id")
    with pytest.raises(DatabaseError, match="addressee_id"), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {broken}", [None] * broken.count("%s"))
