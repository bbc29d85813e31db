"""What every payload a kernel action stores is checked against."""

import hashlib
import json
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings

from sagas import errors

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet

M = TypeVar("M", bound="Model")


def payload_size(payload: Any) -> int:
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


def body_hash(**body: Any) -> str:
    """What an Idempotency-Key was first used for: a retry with another body is a conflict."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def caller_key(by_id: Any, idempotency_key: str) -> str:
    """An Idempotency-Key as its caller's own (two callers' keys never meet), of a length a column
    holds whatever the key's; "" without one."""
    if not idempotency_key:
        return ""
    return hashlib.sha256(f"{by_id}:{idempotency_key}".encode()).hexdigest()


def first_for_key(rows: "QuerySet[M]", digest: str, *, conflict: str) -> M | None:
    """The row an Idempotency-Key was first used for (`rows`: the caller's rows with that key), if
    any; `idempotency_conflict` (with `conflict`) when it was for another body (its `body_hash`)."""
    first = rows.first()
    if first is not None and first.body_hash != digest:  # type: ignore[attr-defined]
        raise errors.IdempotencyConflict(conflict)
    return first


def check_payload(payload: Any, *, field: str = "payload") -> None:
    limit = settings.AGORA_MAX_PAYLOAD_BYTES
    if payload_size(payload) > limit:
        raise errors.PayloadTooLarge(f"Limit is {limit} bytes.", field=field)


def check_goal(text: Any, *, field: str) -> None:
    """A saga's goal or a collaborator's task: text of at most `AGORA_MAX_GOAL_CHARS` characters."""
    limit = settings.AGORA_MAX_GOAL_CHARS
    if not isinstance(text, str) or len(text) > limit:
        raise errors.InvalidPayload(
            f"The {field} is too long.", errors={field: [f"Text of at most {limit} characters."]}
        )
