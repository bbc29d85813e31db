"""Who may read a saga's journal: whoever may see the saga. Journal knows the saga only through its FK."""

from typing import Any
from uuid import UUID

from django.db import models

from journal.models import JournalEvent


def saga_model() -> Any:
    return JournalEvent._meta.get_field("saga").related_model


def viewable_saga(user: Any, saga_id: UUID | str) -> models.Model | None:
    """The saga if user may view it, else None: absent and forbidden look the same."""
    saga: models.Model | None = saga_model().objects.visible_to(user).filter(pk=saga_id).first()
    return saga
