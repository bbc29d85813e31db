from typing import Any, NoReturn

from django.db import models


class AppendOnlyError(Exception):
    """Journal events are never changed or removed."""


class JournalHead(models.Model):
    """The last `seq` allocated in one saga's journal; its row lock orders that saga's writers.
    PostgreSQL's only: SQLite lets one writer in at a time, and takes the seq from the last event."""

    saga = models.OneToOneField("sagas.Saga", on_delete=models.CASCADE, primary_key=True, related_name="+")
    last_seq = models.PositiveBigIntegerField()
    # The created_at of that event: the next one is stamped no earlier, so seq order is time order
    # even for writers whose clocks were read before they took their turn (journal/actions.py).
    last_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.saga_id}: {self.last_seq}"


class JournalEventQuerySet(models.QuerySet["JournalEvent"]):
    def for_saga(self, saga_id: object, *, after: int = 0) -> "JournalEventQuerySet":
        return self.filter(saga_id=saga_id, seq__gt=after).order_by("seq")

    def update(self, **kwargs: Any) -> NoReturn:
        raise AppendOnlyError("Journal events cannot be updated.")

    def delete(self) -> NoReturn:
        raise AppendOnlyError("Journal events cannot be deleted.")


class JournalEvent(models.Model):
    """One append-only record of something that happened in a saga, numbered gap-free per saga."""

    # A saga with a history is never deleted: PROTECT says so on every database alike (on PostgreSQL
    # a cascade would run into the append-only trigger; on SQLite it would silently erase the history).
    saga = models.ForeignKey("sagas.Saga", on_delete=models.PROTECT, related_name="journal_events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    actor = models.CharField(max_length=160, blank=True, help_text="Collaborator id, such as agent:coder-01.")
    run_id = models.CharField(max_length=64, blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = JournalEventQuerySet.as_manager()

    class Meta:
        ordering = ["saga", "seq"]
        constraints = [models.UniqueConstraint(fields=["saga", "seq"], name="journal_event_saga_seq_unique")]
        indexes = [models.Index(fields=["saga", "type"]), models.Index(fields=["actor"])]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("Journal events cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AppendOnlyError("Journal events cannot be deleted.")

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "type": self.type,
            "actor": self.actor,
            "run_id": self.run_id or None,
            "data": self.data,
            "created_at": self.created_at.isoformat().replace("+00:00", "Z"),
        }
