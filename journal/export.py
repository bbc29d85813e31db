import json
from collections.abc import Iterator
from uuid import UUID

from journal.access import EventFilter
from journal.models import JournalEvent

EXPORT_BATCH = 1000


def iter_jsonl(saga_id: UUID | str, *, lens: EventFilter, after: int = 0) -> Iterator[str]:
    """The events of the saga's journal the reader may see, as JSON lines, read in seq-ordered
    batches (constant memory)."""
    while True:
        batch = list(JournalEvent.objects.for_saga(saga_id, after=after)[:EXPORT_BATCH])
        for event in lens.visible(batch):
            yield json.dumps(event.as_dict(), ensure_ascii=False, sort_keys=True) + "\n"
        if len(batch) < EXPORT_BATCH:
            return
        after = batch[-1].seq
