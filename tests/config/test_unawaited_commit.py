"""A COMMIT sent without waiting for its answer (config.sql.commit_unawaited, on PostgreSQL): the
answer is read by the next statement, by await_commit() or by a close; the transaction's on-commit
hooks run only then, after its deferred reads have their rows; a COMMIT that failed raises there
and runs no hook. A turn's use of it: tests/agents/test_commit_before_model_call.py."""

from typing import Any

import pytest
from django.db import DataError, connection, transaction

from accounts.models import User
from config.sql import await_commit, commit_unawaited, defer
from journal.actions import record
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Saga

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def saga(alice: User) -> Saga:
    return actions.create_saga(title="Unawaited", owner=alice)


def in_flight() -> bool:
    return connection.connection is not None and connection.connection.agora_unawaited is not None


def committed_elsewhere(event_id: int) -> bool:
    """Whether another connection sees the event: the COMMIT went through."""
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"], port=settings["PORT"]
    ) as other:
        return (
            other.execute(f"SELECT 1 FROM {JournalEvent._meta.db_table} WHERE id = %s", [event_id]).fetchone()
            is not None
        )


def test_the_hooks_of_a_commit_sent_without_waiting_run_once_its_answer_is_read(saga: Saga) -> None:
    ran: list[Any] = []
    with transaction.atomic():
        event = record(saga_id=saga.pk, type="probe.one", actor="agent:probe")
        transaction.on_commit(lambda: ran.append(event.pk))
        commit_unawaited()
    assert (ran, in_flight()) == ([], True)  # held back while the answer is on its way

    await_commit()

    assert event.pk is not None and ran == [event.pk]  # the deferred read's rows first, then the hooks
    assert not in_flight() and committed_elsewhere(event.pk)

    with transaction.atomic():
        second = record(saga_id=saga.pk, type="probe.two", actor="agent:probe")
        transaction.on_commit(lambda: ran.append(second.pk))
        commit_unawaited()
    assert JournalEvent.objects.filter(type__startswith="probe.").count() == 2  # the next statement reads it
    assert ran == [event.pk, second.pk]

    with transaction.atomic():
        third = record(saga_id=saga.pk, type="probe.three", actor="agent:probe")
        transaction.on_commit(lambda: ran.append(third.pk))
        commit_unawaited()
    connection.close()  # a close reads it too
    assert ran == [event.pk, second.pk, third.pk]


def test_a_commit_sent_without_waiting_that_failed_raises_where_it_is_read_and_runs_no_hook(saga: Saga) -> None:
    ran: list[str] = []
    with transaction.atomic():
        record(saga_id=saga.pk, type="probe.lost", actor="agent:probe")
        defer("SELECT 1 / 0", [])  # fails in the COMMIT's message, after the event's INSERT
        transaction.on_commit(lambda: ran.append("hook"))
        commit_unawaited()

    with pytest.raises(DataError):
        await_commit()

    assert ran == [] and not in_flight()
    assert not JournalEvent.objects.filter(type="probe.lost").exists()  # rolled back whole; the connection works


def test_outside_a_transaction_nothing_is_held_back(saga: Saga) -> None:
    commit_unawaited()
    ran: list[str] = []
    with transaction.atomic():
        record(saga_id=saga.pk, type="probe.plain", actor="agent:probe")
        transaction.on_commit(lambda: ran.append("hook"))
    assert (ran, in_flight()) == (["hook"], False)
