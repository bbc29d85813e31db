"""`journal.actions.record()`: gap-free per-saga numbering, cursors, append-only rows, publish on commit."""

import asyncio
import threading
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import DatabaseError, connection, transaction

from accounts.models import User
from config.notify import notifier
from config.sql import db_value, flush
from journal.actions import group_name, record
from journal.models import AppendOnlyError, JournalEvent
from sagas.actions import create_saga
from sagas.models import Saga

pytestmark = pytest.mark.django_db


def seqs(saga: Saga) -> list[int]:
    return list(JournalEvent.objects.for_saga(saga.pk).values_list("seq", flat=True))


async def receive_within(layer: Any, channel: str, timeout: float) -> dict[str, Any]:
    message: dict[str, Any] = await asyncio.wait_for(layer.receive(channel), timeout)
    return message


def test_seq_starts_at_one_and_counts_up_without_gaps(saga: Saga, base_seq: int) -> None:
    first = JournalEvent.objects.get(saga=saga, seq=1)
    assert (first.type, first.actor) == ("saga.created", "human:alice")

    events = [record(saga_id=saga.pk, type="note", data={"i": i}) for i in range(5)]
    flush()  # its id and seq come back with the deferred statements

    assert [e.seq for e in events] == [base_seq + 1 + i for i in range(5)]
    assert seqs(saga) == list(range(1, base_seq + 6))


def test_an_event_under_a_condition_is_written_only_if_it_holds_and_leaves_no_gap(saga: Saga, base_seq: int) -> None:
    exists = f"EXISTS (SELECT 1 FROM {Saga._meta.db_table} WHERE id = %s)"

    skipped = record(saga_id=saga.pk, type="skipped", when=(exists, [db_value(Saga, "id", uuid.uuid4())]))
    kept = record(saga_id=saga.pk, type="kept", when=(exists, [db_value(Saga, "id", saga.pk)]))
    after = record(saga_id=saga.pk, type="after")
    flush()

    assert skipped.pk is None and not JournalEvent.objects.filter(type="skipped").exists()
    assert (kept.seq, after.seq) == (base_seq + 1, base_seq + 2)  # the head did not move for the skipped one
    assert seqs(saga) == list(range(1, base_seq + 3))


def test_each_saga_has_its_own_sequence(alice: User, saga: Saga, base_seq: int) -> None:
    other = create_saga(title="Another", owner=alice)
    other_base = len(seqs(other))

    record(saga_id=saga.pk, type="note")
    record(saga_id=saga.pk, type="note")
    record(saga_id=other.pk, type="note")

    assert seqs(saga) == list(range(1, base_seq + 3))
    assert seqs(other) == list(range(1, other_base + 2))


def test_record_stores_what_it_was_given(saga: Saga, base_seq: int) -> None:
    event = record(saga_id=saga.pk, type="request.sent", actor="agent:coder", run_id="r-1", data={"to": "agent:qa"})
    flush()  # its id and seq come back with the deferred statements

    stored = JournalEvent.objects.get(pk=event.pk)
    assert stored.as_dict() == {
        "seq": base_seq + 1,
        "type": "request.sent",
        "actor": "agent:coder",
        "run_id": "r-1",
        "data": {"to": "agent:qa"},
        "created_at": stored.created_at.isoformat().replace("+00:00", "Z"),
    }
    assert stored.as_dict()["created_at"].endswith("Z")


def test_a_rolled_back_transaction_leaves_no_gap(saga: Saga, base_seq: int) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        record(saga_id=saga.pk, type="lost")
        record(saga_id=saga.pk, type="lost")
        raise Abort

    after = record(saga_id=saga.pk, type="kept")
    flush()  # its id and seq come back with the deferred statements

    assert after.seq == base_seq + 1
    assert seqs(saga) == list(range(1, base_seq + 2))
    assert not JournalEvent.objects.filter(type="lost").exists()


def test_for_saga_returns_exactly_the_events_after_the_cursor_in_order(alice: User, saga: Saga, base_seq: int) -> None:
    other = create_saga(title="Noise", owner=alice)
    for i in range(6):
        record(saga_id=saga.pk, type="note", data={"i": i})
        record(saga_id=other.pk, type="noise")
    cursor = base_seq + 2

    after_cursor = JournalEvent.objects.for_saga(saga.pk, after=cursor)

    assert [e.seq for e in after_cursor] == [cursor + 1, cursor + 2, cursor + 3, cursor + 4]
    assert [e.data["i"] for e in after_cursor] == [2, 3, 4, 5]
    assert {e.saga_id for e in after_cursor} == {saga.pk}
    assert [e.seq for e in JournalEvent.objects.for_saga(saga.pk)] == list(range(1, base_seq + 7))
    assert list(JournalEvent.objects.for_saga(saga.pk, after=base_seq + 6)) == []


def test_saving_an_existing_event_is_refused(saga: Saga) -> None:
    event = record(saga_id=saga.pk, type="note", data={"v": 1})
    flush()  # its id and seq come back with the deferred statements
    event.data = {"v": 2}

    with pytest.raises(AppendOnlyError):
        event.save()

    assert JournalEvent.objects.get(pk=event.pk).data == {"v": 1}


def test_deleting_an_event_is_refused(saga: Saga) -> None:
    event = record(saga_id=saga.pk, type="note")
    flush()  # its id and seq come back with the deferred statements

    with pytest.raises(AppendOnlyError):
        event.delete()

    assert JournalEvent.objects.filter(pk=event.pk).exists()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda qs: qs.update(type="forged"), id="queryset-update"),
        pytest.param(lambda qs: qs.delete(), id="queryset-delete"),
        pytest.param(lambda qs: JournalEvent.objects.bulk_update(list(qs), ["type"]), id="bulk-update"),
    ],
)
def test_queryset_writes_are_refused(saga: Saga, change: Any) -> None:
    record(saga_id=saga.pk, type="note")
    before = list(JournalEvent.objects.for_saga(saga.pk).values_list("seq", "type"))

    # bulk_update opens an atomic block without a savepoint; ours keeps the test's transaction usable.
    with pytest.raises(AppendOnlyError), transaction.atomic():
        change(JournalEvent.objects.filter(saga=saga))

    assert list(JournalEvent.objects.for_saga(saga.pk).values_list("seq", "type")) == before


@pytest.mark.parametrize(
    "sql",
    [
        pytest.param("UPDATE journal_journalevent SET type = 'forged' WHERE id = %s", id="update"),
        pytest.param("DELETE FROM journal_journalevent WHERE id = %s", id="delete"),
    ],
)
def test_the_database_refuses_raw_update_and_delete(saga: Saga, base_seq: int, sql: str) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the append-only trigger exists on PostgreSQL only; SQLite relies on the model-level refusal")
    event = record(saga_id=saga.pk, type="note")
    flush()  # its id and seq come back with the deferred statements

    # The savepoint keeps the test's transaction usable after the trigger aborts the statement.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [event.pk])

    stored = JournalEvent.objects.get(pk=event.pk)
    assert (stored.seq, stored.type) == (base_seq + 1, "note")


@pytest.mark.django_db(transaction=True)
def test_events_are_published_after_commit_and_never_for_a_rollback(saga: Saga, base_seq: int) -> None:
    notifier().flush(10)  # what the fixtures recorded went out before the test listens
    layer: Any = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group_name(saga.pk), channel)

    with pytest.raises(RuntimeError), transaction.atomic():
        record(saga_id=saga.pk, type="rolled.back")
        raise RuntimeError
    with transaction.atomic():
        committed = record(saga_id=saga.pk, type="committed", data={"k": "v"})

    # The first message in the group is the committed event: the rolled-back one was never sent.
    message = async_to_sync(receive_within)(layer, channel, 10.0)
    assert message == {"type": "journal.events", "events": [JournalEvent.objects.get(pk=committed.pk).as_dict()]}
    assert message["events"][0]["seq"] == base_seq + 1


@pytest.mark.django_db(transaction=True)
def test_events_waiting_to_go_out_leave_together_in_seq_order(saga: Saga, base_seq: int) -> None:
    notifier().flush(10)
    layer: Any = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group_name(saga.pk), channel)
    released = threading.Event()
    notifier().submit(lambda _: asyncio.to_thread(released.wait, 10), "a send that holds the loop")

    for i in range(5):  # five commits while the loop is busy
        with transaction.atomic():
            record(saga_id=saga.pk, type="burst", data={"i": i})
    released.set()

    message = async_to_sync(receive_within)(layer, channel, 10.0)
    assert [(e["seq"], e["data"]["i"]) for e in message["events"]] == [(base_seq + 1 + i, i) for i in range(5)]


@pytest.mark.django_db(transaction=True)
def test_events_of_commits_within_the_linger_leave_together(
    saga: Saga, base_seq: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    notifier().flush(10)
    layer: Any = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group_name(saga.pk), channel)
    monkeypatch.setattr("journal.actions.PUBLISH_LINGER_S", 60.0)  # longer than the test

    for i in range(3):
        with transaction.atomic():
            record(saga_id=saga.pk, type="burst", data={"i": i})
    notifier().flush(10)  # sends what lingers now

    message = async_to_sync(receive_within)(layer, channel, 10.0)
    assert [(e["seq"], e["data"]["i"]) for e in message["events"]] == [(base_seq + 1 + i, i) for i in range(3)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # committed rows: a TRUNCATE behind pending FK checks fails otherwise
def test_the_database_refuses_truncate_without_the_exemption(saga: Saga, base_seq: int) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the append-only triggers exist on PostgreSQL only")
    record(saga_id=saga.pk, type="note")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL agora.allow_journal_truncate = 'off'")  # as any session but the tests'
        cursor.execute("TRUNCATE journal_journalevent CASCADE")
    assert JournalEvent.objects.for_saga(saga.pk).count() == base_seq + 1
