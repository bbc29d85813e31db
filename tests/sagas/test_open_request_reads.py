"""Every ask counts its sender's open requests and reads the deepest hop among its recipient's, and
a run that ends reads the open requests addressed to it: each among the collaborator's open
requests only, found by an index on (collaborator, status), not among all it ever sent or received.
Checked on the plan the database makes for each statement as the hot path runs it: prepared, with a
generic plan, on PostgreSQL (config/postgresql/base.py)."""

import uuid

import pytest
from django.db import connection
from django.utils import timezone

from config.postgresql.base import numbered
from sagas.actions.requests import _ASK_SQL
from sagas.actions.runs import _STRANDED_SQL
from sagas.models import AgentRequest
from tests.sagas.kernel import Team

pytestmark = pytest.mark.django_db

TABLE = AgentRequest._meta.db_table


@pytest.fixture
def history(team: Team) -> Team:
    """Thousands of answered requests between the team's agents, a few open, and the statistics the
    planner reads."""
    cast = [team[name] for name in ["lead", "scout", "coder", "reviewer", "tester"]]
    now = timezone.now()
    AgentRequest.objects.bulk_create(
        AgentRequest(
            id=f"req-{uuid.uuid4().hex[:20]}",
            saga=team.saga,
            sender=cast[i % 5],
            recipient=cast[(i + 1) % 5],
            type="t",
            payload={},
            mode="async",
            status="pending" if i % 500 == 0 else "completed",
            reply={},
            expires_at=now,
        )
        for i in range(4000)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
    return team


def scans(sql: str) -> list[dict[str, str]]:
    """How `sql` reads the requests table: per scan, the index it uses, the conditions the index
    finds rows by, and what is filtered from the rows it found."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", [None] * sql.count("%s"))
            # The table is `q` in _STRANDED_SQL.
            details = [row[-1] for row in cursor.fetchall() if row[-1].split(" ")[1:2] in ([TABLE], ["q"])]
            # "SEARCH t USING INDEX i (a=? AND b=?)": SQLite filters nothing it does not name there.
            return [
                {"index": d.partition(" INDEX ")[2].split(" ")[0], "condition": d.partition("(")[2], "filter": ""}
                for d in details
            ]
        text, n = numbered(sql) or ("", 0)
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE probe AS {text}")
        try:
            cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE probe({', '.join(['NULL'] * n)})")
            (explained,) = cursor.fetchone()
        finally:
            cursor.execute("DEALLOCATE probe")
    found, nodes = [], [explained[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node.get("Relation Name") == TABLE:  # a bitmap heap scan's index scan is its child
            index = node if "Index Name" in node else node["Plans"][0]
            found.append(
                {"index": index["Index Name"], "condition": index["Index Cond"], "filter": node.get("Filter", "")}
            )
    return found


def test_an_ask_counts_the_open_requests_among_the_open_ones(history: Team) -> None:
    found = scans(_ASK_SQL)

    assert len(found) == 3  # the sender's open requests, the recipient's, the idempotency key
    by_index = {scan["index"]: scan for scan in found}
    assert set(by_index) == {"sagas_agent_sender__a4e28f_idx", "sagas_agent_recipie_2c4298_idx",
                             "request_idempotency_unique"}  # fmt: skip
    for scan in found:
        assert "status" in scan["condition"] or "idempotency_key" in scan["condition"], scan
        assert "status" not in scan["filter"], scan


def test_an_ending_run_reads_the_requests_still_open_to_it_among_the_open_ones(history: Team) -> None:
    (scan,) = scans(_STRANDED_SQL)

    assert scan["index"] == "sagas_agent_recipie_2c4298_idx"
    assert "status" in scan["condition"] and "status" not in scan["filter"], scan
