"""The journal's only writer."""

import asyncio
import atexit
import logging
import os
import threading
from functools import partial
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.utils.timezone import now

from journal.models import JournalEvent, JournalHead

logger = logging.getLogger(__name__)

# Two plain statements, no ORM: every change in Agora writes here, several times per agent turn.
# The first allocates the next seq: it inserts the saga's head row or bumps it, and returns the
# new value. The row lock it takes is held until commit, so a saga's writers run one after
# another (SQLite serialises all writers anyway): seqs are gap-free and appear in commit order.
_NEXT_SEQ_SQL = (
    f"INSERT INTO {JournalHead._meta.db_table} (saga_id, last_seq) VALUES (%s, 1) "
    f"ON CONFLICT (saga_id) DO UPDATE SET last_seq = {JournalHead._meta.db_table}.last_seq + 1 "
    "RETURNING last_seq"
)
_INSERT_SQL = (
    f"INSERT INTO {JournalEvent._meta.db_table} (saga_id, seq, type, actor, run_id, data, created_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id"
)


def group_name(saga_id: UUID | str) -> str:
    """The Channels group that carries one saga's live journal."""
    return f"journal.{saga_id}"


_FIELDS: dict[str, Any] = {f.name: f for f in JournalEvent._meta.concrete_fields}


def db_value(field: str, value: Any) -> Any:
    return _FIELDS[field].get_db_prep_value(value, connection)


@transaction.atomic(savepoint=False)
def record(
    *, saga_id: UUID | str, type: str, actor: str = "", run_id: str = "", data: dict[str, Any] | None = None
) -> JournalEvent:
    """Append one event to a saga's journal, in the caller's transaction; it is published after commit."""
    saga_key = db_value("saga", saga_id)
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_SEQ_SQL, [saga_key])
        (seq,) = cursor.fetchone()
        # Stamped once the seq is taken, while the saga's other writers wait: seq order is time order.
        event = JournalEvent(
            saga_id=saga_id, seq=seq, type=type, actor=actor, run_id=run_id, data=data or {}, created_at=now()
        )
        data_value, created_value = db_value("data", event.data), db_value("created_at", event.created_at)
        cursor.execute(_INSERT_SQL, [saga_key, seq, type, actor, run_id, data_value, created_value])
        (event.pk,) = cursor.fetchone()
    event._state.adding, event._state.db = False, connection.alias
    transaction.on_commit(partial(publish, saga_id, event.as_dict()))
    return event


PUBLISH_TIMEOUT_S = 5.0
PUBLISH_BACKLOG_MAX = 10_000


class Publisher:
    """This process's journal publisher: one event loop on a daemon thread that sends events to
    the channel layer one after another, in the order they were committed.

    The committing thread only hands the event over: a turn does not wait for the dashboard's
    fan-out. One loop for the process's lifetime, so the channel layer keeps its Redis connections
    (the layer pools connections per event loop). Made anew in a forked child (a Celery pool
    process), where the parent's thread does not exist. At most once, like every publish here: a
    listener that misses an event reads it back from the database.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(PUBLISH_BACKLOG_MAX)
        threading.Thread(target=self.loop.run_forever, name="journal-publish", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.drain(), self.loop)

    def submit(self, saga_id: UUID | str, event: dict[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self.enqueue, str(saga_id), event)

    def enqueue(self, saga_id: str, event: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait((saga_id, event))
        except asyncio.QueueFull:
            logger.warning("journal publish for saga %s seq %s dropped: backlog full", saga_id, event["seq"])

    async def drain(self) -> None:
        while True:
            saga_id, event = await self.queue.get()
            try:
                layer = get_channel_layer()
                if layer is not None:
                    message = {"type": "journal.event", "event": event}
                    await asyncio.wait_for(layer.group_send(group_name(saga_id), message), PUBLISH_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - Redis down, a timeout, a full channel: log and go on
                logger.warning("journal publish for saga %s seq %s failed: %s", saga_id, event["seq"], exc)
            finally:
                self.queue.task_done()

    def flush(self, timeout: float) -> None:
        """Wait until every event handed over so far was sent (or failed)."""
        try:
            asyncio.run_coroutine_threadsafe(self.queue.join(), self.loop).result(timeout)
        except TimeoutError:
            logger.warning("journal publish: %s events still unsent", self.queue.qsize())


_publisher_lock = threading.Lock()
_publisher: Publisher | None = None


def publisher() -> Publisher:
    global _publisher
    with _publisher_lock:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = Publisher()
        return _publisher


def publish(saga_id: UUID | str, event: dict[str, Any]) -> None:
    """Ring the saga's live listeners, without waiting for the send."""
    publisher().submit(saga_id, event)


@atexit.register
def flush_at_exit() -> None:
    """A process that exits normally sends what it committed first."""
    if _publisher is not None and _publisher.pid == os.getpid():
        _publisher.flush(PUBLISH_TIMEOUT_S)
