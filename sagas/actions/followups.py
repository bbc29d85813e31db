"""Follow-ups: the sender of an open request adds to it, and the recipient reads it at its next turn
boundary, as it reads any steering. A protocol gateway uses this for a client's further messages to
a task that is still going on (A2A's multi-message tasks)."""

from typing import Any

from django.db import transaction

from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.actions.locking import lock_saga
from sagas.actions.payloads import check_payload
from sagas.actions.requests import closed_error, get_request_for
from sagas.actions.steering import check_backlog, push_steering
from sagas.models import AgentRequest, SteeringItem


@transaction.atomic
def follow_up_request(*, request_id: str, by: User, message: Any, idempotency_key: str = "") -> SteeringItem:
    """A message from the request's sender to its recipient about that open request: a steering
    item `{"request_id", "message"}`. The same idempotency key returns the first item."""
    request = get_request_for(by, request_id)
    lock_saga(request.saga_id)
    if request.sender.user_id != by.pk:
        raise errors.Forbidden("Only the sender follows up its request.")
    request.refresh_from_db(fields=["status", "error"])
    if request.status not in AgentRequest.OPEN:
        raise closed_error(request)
    check_payload(message, field="message")
    sender, recipient = request.sender, request.recipient
    if idempotency_key:
        first = SteeringItem.objects.filter(
            recipient=recipient, kind=SteeringItem.Kind.MESSAGE, sender=sender.handle,
            payload__request_id=request.pk, payload__key=idempotency_key,
        ).first()  # fmt: skip
        if first is not None:  # the saga lock serialises the check and the write
            return first
    check_backlog(recipient)
    payload: dict[str, Any] = {"request_id": request.pk, "message": message}
    if idempotency_key:
        payload["key"] = idempotency_key
    # Not linked through the item's request: that link is one item per request and kind.
    item = push_steering(recipient=recipient, kind=SteeringItem.Kind.MESSAGE, sender=sender.handle, payload=payload)
    record(
        saga_id=request.saga_id,
        type="request.followed_up",
        actor=sender.handle,
        data={"request_id": request.pk, "to": recipient.handle, "seq": item.seq, "message": message},
    )
    return item
