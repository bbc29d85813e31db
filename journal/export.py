import json
from collections.abc import AsyncIterator, Iterator
from uuid import UUID

from asgiref.sync import sync_to_async

from journal.access import EventFilter
from journal.models import JournalEvent

EXPORT_BATCH = 1000


def iter_jsonl(saga_id: UUID | str, *, lens: EventFilter, after: int = 0) -> Iterator[str]:
    """The events of the saga's journal the reader may see, as JSON lines, read in seq-ordered
    batches (constant memory)."""
    cursor: int | None = after
    while cursor is not None:
        lines, cursor = jsonl_batch(saga_id, lens=lens, after=cursor)
        yield from lines


async def aiter_jsonl(saga_id: UUID | str, *, lens: EventFilter, after: int = 0) -> AsyncIterator[str]:
    """iter_jsonl for an ASGI server, which streams an async iterator as it goes (a sync one it
    reads whole first): each batch read in a thread and sent as one chunk."""
    cursor: int | None = after
    while cursor is not None:
        lines, cursor = await sync_to_async(jsonl_batch)(saga_id, lens=lens, after=cursor)
        if lines:
            yield "".join(lines)


def jsonl_batch(saga_id: UUID | str, *, lens: EventFilter, after: int) -> tuple[list[str], int | None]:
    """One batch of the export: its lines, and the cursor of the next batch (None after the last)."""
    batch = list(JournalEvent.objects.for_saga(saga_id, after=after)[:EXPORT_BATCH])
    lines = [json.dumps(event.as_dict(), ensure_ascii=False, sort_keys=True) + "\n" for event in lens.visible(batch)]
    return lines, batch[-1].seq if len(batch) == EXPORT_BATCH else None
