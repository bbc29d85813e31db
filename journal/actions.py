"""The journal's only writer."""

import logging
from functools import partial
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer
from django.db import connection, transaction

from config.notify import notifier
from config.sql import db_value, insert
from journal.models import JournalEvent, JournalHead

logger = logging.getLogger(__name__)

# Two plain statements, no ORM compile (config/sql.py): every change in Agora writes here, several
# times per agent turn. The first allocates the next seq: it inserts the saga's head row or bumps
# it, and returns the new value. The row lock it takes is held until commit, so a saga's writers
# run one after another (SQLite serialises all writers anyway): seqs are gap-free and appear in
# commit order.
_NEXT_SEQ_SQL = (
    f"INSERT INTO {JournalHead._meta.db_table} (saga_id, last_seq) VALUES (%s, 1) "
    f"ON CONFLICT (saga_id) DO UPDATE SET last_seq = {JournalHead._meta.db_table}.last_seq + 1 "
    "RETURNING last_seq"
)


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
    *, saga_id: UUID | str, type: str, actor: str = "", run_id: str = "", data: dict[str, Any] | None = None
) -> JournalEvent:
    """Append one event to a saga's journal, in the caller's transaction; it is published after commit."""
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_SEQ_SQL, [db_value(JournalEvent, "saga", saga_id)])
        (seq,) = cursor.fetchone()
    # Stamped (auto_now_add) once the seq is taken, while the saga's other writers wait: seq order
    # is time order.
    event = insert(JournalEvent(saga_id=saga_id, seq=seq, type=type, actor=actor, run_id=run_id, data=data or {}))
    transaction.on_commit(partial(publish, saga_id, event.as_dict()))
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
