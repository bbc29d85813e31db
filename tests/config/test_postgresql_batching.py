"""The PostgreSQL backend (config/postgresql/base.py) sends a transaction's BEGIN, its savepoints
and its deferred writes in one message with the next statement or the COMMIT: fewer round trips,
the same statements in the same order, the same outcome. Round trips are counted from the wire,
with libpq's protocol trace: each ends with the server's ReadyForQuery."""

import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction
from psycopg import pq

from accounts.models import User
from config.postgresql.base import DatabaseWrapper, numbered
from config.sql import defer, prepared
from sagas import actions
from sagas.actions.requests import _ASK_SQL
from sagas.models import Delegation, Run
from tests.sagas.conftest import build_team
from tests.sagas.kernel import written_out

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def table() -> Iterator[str]:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE batching_probe (id integer PRIMARY KEY, note text NOT NULL)")
    yield "batching_probe"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE batching_probe")


@contextmanager
def wire() -> Iterator[Callable[[], list[str]]]:
    """The messages sent to the server meanwhile (their text), one per round trip."""
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        lines: list[str] = []
        try:
            yield lambda: lines
        finally:
            pgconn.untrace()
            trace.seek(0)
            lines += trace.read().decode().splitlines()
    trips = sum(1 for line in lines if "\tReadyForQuery\t" in line)
    sent = [line.split("\t")[3].strip().strip('"') for line in lines if line.startswith("F\t") and "\tQuery\t" in line]
    assert len(sent) == trips, lines  # every message was a simple query answered before the next
    lines[:] = sent


def rows(table: str) -> list[tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, note FROM {table} ORDER BY id")
        return list(cursor.fetchall())


def test_begin_savepoints_and_a_deferred_write_ride_with_statements(table: str) -> None:
    connection.ensure_connection()
    with wire() as sent, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [1, "first"])
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [2, "in a savepoint"])
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [3, "100% deferred"])
    messages = sent()
    assert len(messages) == 3, messages  # with psycopg's own BEGIN and Django's savepoints: 7
    assert messages[0].startswith("BEGIN; INSERT")
    assert messages[1].startswith("SAVEPOINT") and "; INSERT" in messages[1]
    assert messages[2].endswith("; COMMIT") and "100% deferred" in messages[2]
    assert rows(table) == [(1, "first"), (2, "in a savepoint"), (3, "100% deferred")]


def test_a_transaction_in_which_nothing_runs_sends_nothing() -> None:
    connection.ensure_connection()
    with wire() as sent, transaction.atomic(), transaction.atomic():
        pass
    assert sent() == []


def test_a_rolled_back_savepoint_undoes_its_writes_deferred_or_not(table: str) -> None:
    with transaction.atomic():
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "before the savepoint"])
        with pytest.raises(RuntimeError), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [2, "undone"])
            defer(f"INSERT INTO {table} VALUES (%s, %s)", [3, "undone, never sent"])
            raise RuntimeError
        with pytest.raises(RuntimeError), transaction.atomic():
            defer(f"INSERT INTO {table} VALUES (%s, %s)", [4, "undone, never sent"])
            raise RuntimeError
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [5, "after"])
    assert rows(table) == [(1, "before the savepoint"), (5, "after")]


def test_a_released_savepoint_keeps_its_deferred_writes_whether_or_not_it_was_sent(table: str) -> None:
    with wire() as sent, transaction.atomic():
        with transaction.atomic():  # nothing but deferred writes in it: its SAVEPOINT never goes
            defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "deferred in a savepoint"])
            with transaction.atomic():
                defer(f"INSERT INTO {table} VALUES (%s, %s)", [2, "deferred two savepoints deep"])
        with transaction.atomic():  # its SAVEPOINT went with a statement run in it
            with connection.cursor() as cursor:
                cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [3, "run in a savepoint"])
            defer(f"INSERT INTO {table} VALUES (%s, %s)", [4, "deferred after it"])
    assert rows(table) == [
        (1, "deferred in a savepoint"), (2, "deferred two savepoints deep"), (3, "run in a savepoint"),
        (4, "deferred after it"),
    ]  # fmt: skip
    assert len(sent()) == 2  # the first block's writes went with the second block's statement


def test_a_failing_deferred_write_fails_its_transaction_at_commit(table: str) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [1, "kept only if all is"])
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "a duplicate key"])
    assert rows(table) == []
    with transaction.atomic():  # the connection is usable again
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [2, "next"])
    assert rows(table) == [(2, "next")]


def test_a_failing_statement_rolls_back_to_its_savepoint_with_what_went_before_it(table: str) -> None:
    with transaction.atomic():
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "kept"])
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [1, "a duplicate of the deferred write"])
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} VALUES (%s, %s)", [2, "after the failure"])
    assert rows(table) == [(1, "kept"), (2, "after the failure")]


def test_outside_a_transaction_a_deferred_write_runs_at_once(table: str) -> None:
    defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "now"])
    assert connection.connection.info.transaction_status == pq.TransactionStatus.IDLE
    assert rows(table) == [(1, "now")]


def fresh(sql: str) -> str:
    """A statement this connection has not prepared yet (it keeps what it prepared across tests)."""
    return prepared(f"{sql} /* {uuid.uuid4().hex} */")


def test_a_hot_statement_is_prepared_once_then_executed(table: str) -> None:
    insert = fresh(f"INSERT INTO {table} VALUES (%s, %s)")
    count = fresh(f"SELECT COUNT(*) FROM {table} WHERE note LIKE %s")
    with wire() as sent:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(insert, [1, "one"])
            cursor.execute(insert, [2, "50% two"])
            defer(insert, [3, "three"])
        with connection.cursor() as cursor:
            cursor.execute(count, ["%two"])
            first = cursor.fetchone()
            cursor.execute(count, ["%o%"])
            second = cursor.fetchone()
    messages = sent()
    assert messages[0].startswith("BEGIN; PREPARE agora_") and "; EXECUTE agora_" in messages[0]
    assert messages[1].startswith("EXECUTE agora_") and "'50% two'" in messages[1]
    assert messages[2].startswith("EXECUTE agora_") and messages[2].endswith("; COMMIT")
    assert messages[3].startswith("PREPARE agora_") and "LIKE $1 " in messages[3] and "; EXECUTE agora_" in messages[3]
    assert messages[4].startswith("EXECUTE agora_")
    assert (first, second) == ((1,), (2,))
    assert rows(table) == [(1, "one"), (2, "50% two"), (3, "three")]


def test_a_rollback_keeps_what_was_prepared(table: str) -> None:
    insert = fresh(f"INSERT INTO {table} VALUES (%s, %s)")
    with pytest.raises(RuntimeError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(insert, [1, "rolled back"])
        raise RuntimeError
    with wire() as sent, connection.cursor() as cursor:
        cursor.execute(insert, [2, "kept"])
    assert sent()[0].startswith("EXECUTE agora_")
    assert rows(table) == [(2, "kept")]


def test_a_message_that_fails_before_its_prepare_forgets_it(table: str) -> None:
    insert = fresh(f"INSERT INTO {table} VALUES (%s, %s)")
    select = fresh(f"SELECT note FROM {table} WHERE id = %s")
    with pytest.raises(IntegrityError), transaction.atomic():
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "first"])
        defer(f"INSERT INTO {table} VALUES (%s, %s)", [1, "a duplicate: the message stops here"])
        with connection.cursor() as cursor:
            cursor.execute(select, [1])
    with wire() as sent, connection.cursor() as cursor:  # prepared again, under another name
        cursor.execute(select, [1])
        assert cursor.fetchone() is None
        cursor.execute(insert, [2, "after"])
    assert sent()[0].startswith("PREPARE agora_")
    assert rows(table) == [(2, "after")]


def test_a_prepare_dropped_with_its_savepoint_is_sent_again(table: str) -> None:
    insert = fresh(f"INSERT INTO {table} VALUES (%s, %s)")
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            defer(insert, [1, "undone, never sent, nor its PREPARE"])
            raise RuntimeError
        defer(insert, [2, "kept"])
    assert rows(table) == [(2, "kept")]


def test_preparing_can_be_switched_off() -> None:
    options = {**connection.settings_dict["OPTIONS"], "prepared_statements": False}
    other = DatabaseWrapper({**connection.settings_dict, "OPTIONS": options}, alias="unprepared")
    try:
        with other.cursor() as cursor:
            for n in (1, 2):
                cursor.execute(fresh("SELECT %s::int"), [n])
            assert cursor.fetchone() == (2,)
            cursor.execute("SELECT COUNT(*) FROM pg_prepared_statements")
            assert cursor.fetchone() == (0,)
            cursor.execute("SHOW plan_cache_mode")  # nothing of the session is set (a pooler's)
            assert cursor.fetchone() == ("auto",)
    finally:
        other.close()


def test_a_prepared_statement_is_planned_once_per_connection() -> None:
    """Its generic plan from the first execution on: the server plans none of them again."""
    statement = fresh("SELECT COUNT(*) FROM sagas_run WHERE status = %s")
    with connection.cursor() as cursor:
        for _ in range(3):
            cursor.execute(statement, ["queued"])
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE strpos(statement, %s) > 0",
            [statement.rsplit("/*", 1)[1]],
        )
        assert cursor.fetchall() == [(3, 0)]


def test_placeholders_are_numbered_and_percent_signs_kept() -> None:
    assert numbered("SELECT %s, '100%%', %s") == ("SELECT $1, '100%', $2", 2)
    assert numbered("SELECT %(name)s") is None


def test_an_ask_in_a_turn_reads_in_the_message_that_takes_the_saga_lock(alice: User) -> None:
    """A turn's transaction (the saga's lock held, its copy current): BEGIN, the lock and the ask's
    one read (the recipient and its run, the grant, the limits, the idempotency key's use, the
    saga's status) go in the first message; the request, its steering item, the recipient's
    wake-up and the journal event with the COMMIT."""
    team = build_team(owner=alice, internal=["coder"])
    Run.objects.filter(pk=team.run("coder").pk).update(status=Run.Status.IDLE)  # woken by the ask
    lead = team["lead"]
    connection.ensure_connection()
    with wire() as sent, actions.saga_transaction(lead.saga, current=True):
        actions.ask_agent(sender=lead, to="agent:coder", type="ping", payload={}, idempotency_key="call-1")
    messages = [written_out(message) for message in sent()]
    first = messages[0].split("; ")
    assert first[0] == "BEGIN" and first[1].endswith("FOR NO KEY UPDATE")
    assert first[-1].startswith(_ASK_SQL.split("%s")[0])
    assert len(messages) == 2, messages  # with one read for each of those, and the event's own: 8
    last = messages[-1]
    assert "INSERT INTO sagas_agentrequest" in last and "INSERT INTO sagas_steeringitem" in last
    assert "UPDATE sagas_run SET status" in last  # the wake-up
    assert last.endswith("RETURNING id, seq, created_at; COMMIT")  # the journal event's
    assert all(not m.startswith("SELECT") for m in messages[1:])


def test_a_delegation_sends_all_its_rows_with_the_commit(alice: User) -> None:
    """Adding an agent reads what it checks and the keys its rows refer to (its user's, its
    collaborator's, from their sequences) in one message; its user, its collaborator, its
    delegation (whose key comes back with it), its run (keyed here) and its permission grants go
    in the last message, with the journal event and the COMMIT: two round trips in all."""
    team = build_team(owner=alice, internal=["coder"])
    lead = team["lead"]
    connection.ensure_connection()
    with wire() as sent, actions.saga_transaction(lead.saga, current=True):
        helper, _ = actions.add_agent(
            saga=lead.saga, name="helper", role="H", task="Help.", runtime="internal", profile="responder",
            parent=lead.handle, by=lead.user, ring=False,
        )  # fmt: skip
    messages = [written_out(message) for message in sent()]
    last = messages[-1]
    later = (
        "INSERT INTO accounts_user", "INSERT INTO sagas_collaborator", "INSERT INTO sagas_delegation",
        "INSERT INTO sagas_run", "INSERT INTO guardian_userobjectpermission",
    )  # fmt: skip
    assert all(insert in last for insert in later), messages
    assert last.endswith("COMMIT") and len(messages) == 2, messages
    # The saga's tree and the new keys are read in the message that reads the profile names the
    # delegation checks.
    (first,) = messages[:-1]
    assert "FROM agents_agentprofile WHERE name IN" in first and "nextval(" in first, messages
    assert "FROM sagas_collaborator c LEFT JOIN sagas_run" in first, messages
    helper.refresh_from_db()  # as stored, with the keys it was given
    assert Run.objects.filter(collaborator=helper, status=Run.Status.QUEUED).exists()
    assert helper.delegation.pk == Delegation.objects.get(delegate=helper).pk
    assert helper.user.username.endswith(".helper") and helper.user.has_perm("sagas.view_saga", lead.saga)
    assert lead.user.has_perm("sagas.address_collaborator", helper)


def test_a_run_ends_with_its_compare_and_set_and_the_read_of_what_it_strands_in_one_message(alice: User) -> None:
    team = build_team(owner=alice, internal=["coder"])
    run = Run.objects.select_related("collaborator__saga").get(pk=team.run("coder").pk)
    connection.ensure_connection()
    with wire() as sent, actions.saga_transaction(run.collaborator.saga, current=True):
        assert actions.finish_run(run=run, status=Run.Status.COMPLETED, result={"ok": True})
    messages = [written_out(message) for message in sent()]
    assert len(messages) == 2, messages  # the rest (its delegation, its waits, the event) with the COMMIT
    first = [part for part in messages[0].split("; ") if not part.startswith("SAVEPOINT")]
    assert first[0] == "BEGIN" and first[1].endswith("FOR NO KEY UPDATE")
    assert first[2].startswith("UPDATE sagas_run SET status") and first[3].startswith("SELECT q.")
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
