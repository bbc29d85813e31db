"""The journal's only writer."""

import logging
from functools import partial
from typing import Any
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction
from redis.exceptions import RedisError

from journal.models import JournalEvent, JournalHead

logger = logging.getLogger(__name__)

# One statement allocates the next seq: it inserts the saga's head row or bumps it, and returns
# the new value. The row lock it takes is held until commit, so a saga's writers run one after
# another (SQLite serialises all writers anyway): seqs are gap-free and appear in commit order.
_NEXT_SEQ_SQL = (
    f"INSERT INTO {JournalHead._meta.db_table} (saga_id, last_seq) VALUES (%s, 1) "
    f"ON CONFLICT (saga_id) DO UPDATE SET last_seq = {JournalHead._meta.db_table}.last_seq + 1 "
    "RETURNING last_seq"
)


def group_name(saga_id: UUID | str) -> str:
    """The Channels group that carries one saga's live journal."""
    return f"journal.{saga_id}"


@transaction.atomic
def record(
    *, saga_id: UUID | str, type: str, actor: str = "", run_id: str = "", data: dict[str, Any] | None = None
) -> JournalEvent:
    """Append one event to a saga's journal, in the caller's transaction; it is published after commit."""
    saga_key = JournalHead._meta.pk.get_db_prep_value(saga_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_SEQ_SQL, [saga_key])
        (seq,) = cursor.fetchone()
    event = JournalEvent.objects.create(
        saga_id=saga_id, seq=seq, type=type, actor=actor, run_id=run_id, data=data or {}
    )
    transaction.on_commit(partial(publish, saga_id, event.as_dict()))
    return event


def publish(saga_id: UUID | str, event: dict[str, Any]) -> None:
    """Ring the saga's live listeners. At most once: a listener that misses it re-reads the database."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group_name(saga_id), {"type": "journal.event", "event": event})
    except (OSError, RedisError) as exc:
        logger.warning("journal publish for saga %s seq %s failed: %s", saga_id, event["seq"], exc)
