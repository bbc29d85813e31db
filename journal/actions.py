"""The journal's only writer."""

import logging
from collections.abc import Sequence
from functools import cache
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.utils import timezone

from config.notify import notifier
from config.sql import Statement, db_value, defer, flush, prepared, py_value
from journal.models import JournalEvent, JournalHead

logger = logging.getLogger(__name__)

# A plain statement, no ORM compile (config/sql.py): every change in Agora writes here, several
# times per agent turn. On PostgreSQL it first allocates the next seq: it inserts the saga's head row
# or bumps it, with the event's time, never earlier than the previous event's. The row lock that
# takes is held until commit, so a saga's writers run one after another: seqs are gap-free and
# appear in commit order, and seq order is time order. Then it inserts the event with the head's
# seq and time. Nobody waits for it: it goes with the transaction's next statement or its COMMIT
# (config.sql.defer), and the event's id and seq come back with them. A condition (`when`) decides
# in the same statement whether the event is written at all; a head it leaves alone leaves no gap.
_HEAD = JournalHead._meta.db_table
_APPEND_WHEN_SQL = (
    f"WITH head AS (INSERT INTO {_HEAD} (saga_id, last_seq, last_at) SELECT %s, 1, %s WHERE {{when}} "
    f"ON CONFLICT (saga_id) DO UPDATE SET last_seq = {_HEAD}.last_seq + 1, "
    f"last_at = CASE WHEN {_HEAD}.last_at > EXCLUDED.last_at THEN {_HEAD}.last_at ELSE EXCLUDED.last_at END "
    "RETURNING saga_id, last_seq, last_at) "
    f"INSERT INTO {JournalEvent._meta.db_table} (saga_id, seq, type, actor, run_id, data, created_at) "
    "SELECT saga_id, last_seq, %s, %s, %s, %s, last_at FROM head RETURNING id, seq, created_at"
)

# On SQLite, which lets in one writer at a time (every transaction begins IMMEDIATE, config/sqlite/),
# one statement does both: the saga's last event, found through the (saga, seq) unique index,
# gives the next seq and the earliest time allowed. The head row is PostgreSQL's only.
_EVENTS = JournalEvent._meta.db_table
_APPEND_SQLITE_WHEN_SQL = (
    f"INSERT INTO {_EVENTS} (saga_id, seq, type, actor, run_id, data, created_at) "
    "SELECT %s, COALESCE(prev.seq, 0) + 1, %s, %s, %s, %s, "
    "CASE WHEN prev.created_at > %s THEN prev.created_at ELSE %s END FROM (SELECT 1) LEFT JOIN "
    f"(SELECT seq, created_at FROM {_EVENTS} WHERE saga_id = %s ORDER BY seq DESC LIMIT 1) prev ON 1 "
    "WHERE {when} RETURNING id, seq, created_at"
)
Condition = tuple[str, Sequence[Any]]  # an SQL expression and its parameters: record()'s `when`
ALWAYS: Condition = ("1 = 1", ())


@cache
def append_sql(vendor: str, when: str) -> Statement:
    """The append, written only if the condition `when` holds when it runs (ALWAYS: always)."""
    return prepared((_APPEND_SQLITE_WHEN_SQL if vendor == "sqlite" else _APPEND_WHEN_SQL).format(when=when))


# How long a saga's first unsent event waits for more to go out with it. A live view does not see
# 50 ms; meanwhile a turn's events gather into one message, and the fan-out to live views, the
# least urgent work of a worker, stays off the few milliseconds in which wake-ups and claims carry
# an agent's request and its reply.
PUBLISH_LINGER_S = 0.05


def group_name(saga_id: UUID | str) -> str:
    """The Channels group that carries one saga's live journal."""
    return f"journal.{saga_id}"


@transaction.atomic(savepoint=False)
def record(
    *,
    saga_id: UUID | str,
    type: str,
    actor: str = "",
    run_id: str = "",
    data: dict[str, Any] | None = None,
    when: Condition = ALWAYS,
) -> JournalEvent:
    """Append one event to a saga's journal, in the caller's transaction; it is published after commit.

    Nothing waits for its statement: on PostgreSQL it goes with the transaction's next
    statement or its COMMIT, and the event's `pk`, `seq` and `created_at` are set when they come
    back (at once on SQLite; when record() is a transaction of its own, before it returns).
    `when`: an SQL condition and its parameters; the event is written only if it holds when the
    statement runs (its `pk` then stays None, and nothing is published)."""
    saga = db_value(JournalEvent, "saga", saga_id)
    event = JournalEvent(saga_id=saga_id, type=type, actor=actor, run_id=run_id, data=data or {})

    def stored(rows: list[tuple[Any, ...]]) -> None:
        for event.pk, event.seq, created_at in rows:
            event.created_at = py_value(JournalEvent, "created_at", created_at)

    now, data_value = db_value(JournalEvent, "created_at", timezone.now()), db_value(JournalEvent, "data", event.data)
    condition, condition_params = when
    sql = append_sql(connection.vendor, condition)
    if connection.vendor == "sqlite":
        defer(sql, [saga, type, actor, run_id, data_value, now, now, saga, *condition_params], then=stored)
    else:
        defer(sql, [saga, now, *condition_params, type, actor, run_id, data_value], then=stored)
    event._state.adding, event._state.db = False, connection.alias

    def committed() -> None:
        if event.pk is None:  # run before the COMMIT (a test's captureOnCommitCallbacks), or not written
            flush()
        if event.pk is not None:
            publish(saga_id, event.as_dict())

    transaction.on_commit(committed)
    return event


def publish(saga_id: UUID | str, event: dict[str, Any]) -> None:
    """Ring the saga's live listeners, without waiting: the events of one saga that are waiting to
    go out leave together, in one message."""

    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all(events: list[dict[str, Any]]) -> None:
        await layer.group_send(group_name(saga_id), {"type": "journal.events", "events": events})

    notifier().gather(
        f"journal:{saga_id}",
        event,
        send_all,
        f"journal publish for saga {saga_id} seq {event['seq']}",
        linger=PUBLISH_LINGER_S,
    )
