"""Who may read a saga's journal, and which of its events. The journal sits below the kernel: it knows
the saga only through its FK, and the rule for events is the kernel's, handed over at start-up."""

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured
from django.db import models

from journal.models import JournalEvent

E = TypeVar("E")


class EventFilter(Protocol):
    """The events of one saga one reader may see (`sagas.access.JournalLens`)."""

    everything: bool

    def visible(self, events: Sequence[E]) -> list[E]: ...


class Everything:
    """The whole journal: for operators on the server (`manage.py export_journal`), never for a request."""

    everything = True

    def visible(self, events: Sequence[E]) -> list[E]:
        return list(events)


ReaderRule = Callable[[Any, Any], EventFilter]  # (user, saga) → its filter
_reader_rule: ReaderRule | None = None


def provide_reader_rule(rule: ReaderRule) -> None:
    """Called once by the kernel when its app is ready: the one rule every journal reader applies."""
    global _reader_rule
    _reader_rule = rule


def reader_filter(user: Any, saga: models.Model) -> EventFilter:
    """The filter of one reader of one saga; refuses to serve anything if the kernel gave no rule."""
    if _reader_rule is None:
        raise ImproperlyConfigured("No journal reader rule: the sagas app provides it when it is ready.")
    return _reader_rule(user, saga)


def saga_model() -> Any:
    return JournalEvent._meta.get_field("saga").related_model


def viewable_saga(user: Any, saga_id: UUID | str) -> models.Model | None:
    """The saga if user may view it, else None: absent and forbidden look the same."""
    saga: models.Model | None = saga_model().objects.visible_to(user).filter(pk=saga_id).first()
    return saga
