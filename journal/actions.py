"""The journal's only writer."""

import asyncio
import logging
import os
import threading
from functools import partial
from typing import Any
from uuid import UUID

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


@transaction.atomic(savepoint=False)
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


PUBLISH_TIMEOUT_S = 5.0
_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def publishing_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for publishing, on a daemon thread.

    One loop for the process's lifetime, so the channel layer keeps its Redis connections: the
    layer pools connections per event loop, and `async_to_sync` would start a thread, a loop and a
    new connection for every event (a few milliseconds each, several times per turn). Made anew in
    a forked child (a Celery pool process), where the parent's thread does not exist.
    """
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="journal-publish", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def publish(saga_id: UUID | str, event: dict[str, Any]) -> None:
    """Ring the saga's live listeners. At most once: a listener that misses it re-reads the database.

    Waits for the send, so one process's events leave in commit order.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "journal.event", "event": event}
    future = asyncio.run_coroutine_threadsafe(layer.group_send(group_name(saga_id), message), publishing_loop())
    try:
        future.result(timeout=PUBLISH_TIMEOUT_S)
    except (OSError, RedisError) as exc:  # TimeoutError is an OSError
        future.cancel()
        logger.warning("journal publish for saga %s seq %s failed: %s", saga_id, event["seq"], exc)
