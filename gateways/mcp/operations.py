"""The collaboration tools an MCP client calls, each the kernel action behind the REST API.

Each operation is synchronous and takes the authenticated principal: identity comes from the API
token the MCP connection was opened with, never from a tool's arguments. Results have the shapes of
DESIGN.md §6 and of the REST responses, so an agent can move between the two without surprises.
Kernel errors are raised as they are (`sagas.errors`); the server turns them into tool errors with
the same stable `code`.
"""

from typing import Any

from django.conf import settings
from django.utils import timezone

from accounts.authentication import authenticate_key
from accounts.models import User
from sagas import actions, errors, waits
from sagas.access import collaborator_card, visible_collaborators
from sagas.models import AgentRequest, Collaborator, SteeringItem
from sagas.waits import WaitSlot

STEERING_PAGE = 200  # as over REST: the caller pages on with `after`


class AuthenticationFailed(errors.KernelError):
    code = "authentication_failed"
    status = 401
    title = "Authentication failed"


def principal(key: str) -> User:
    """The agent an API token belongs to, checked at every call so that a revoked token stops working."""
    token = authenticate_key(key) if key else None
    if token is None:
        raise AuthenticationFailed("Invalid or missing API token.")
    return token.user


def me(user: User) -> Collaborator:
    """The caller's own collaborator: an external agent's token belongs to exactly one saga."""
    collaborator = (
        Collaborator.objects.filter(user=user, kind=Collaborator.Kind.AGENT)
        .select_related("saga", "run", "user")
        .first()
    )
    if collaborator is None:
        raise errors.Forbidden("These tools are for the agents of a saga; this token is not one's.")
    return collaborator


def get_collaborators(user: User) -> dict[str, Any]:
    return {"collaborators": [collaborator_card(c) for c in visible_collaborators(me(user))]}


def ask_agent(
    user: User, *, to: str, type: str, payload: Any, mode: str, timeout_s: float | None, idempotency_key: str
) -> tuple[AgentRequest, bool]:
    return actions.ask_agent(
        sender=me(user), to=to, type=type, payload=payload, mode=mode, timeout_s=timeout_s,
        idempotency_key=idempotency_key,
    )  # fmt: skip


def hold_wait(user: User) -> WaitSlot:
    """A place among the agent's and the saga's waits in progress, the same as the REST API's
    (`too_many_waits` past either cap); taken before anything is written."""
    return waits.hold_wait(me(user))


def pending(request_id: str, *, timed_out: bool = False) -> dict[str, Any]:
    return {"request_id": request_id, "status": "pending", **({"timed_out": True} if timed_out else {})}


def wait_check(request_id: str) -> dict[str, Any] | float:
    """One look at a request its sender waits on: its outcome, or how long the wait may still last.

    Same rule as over REST: the wait lasts until the request's `wait_deadline` (the waits-for edge);
    once that passes the edge goes and the caller gets `timed_out`, while the request stays open
    for a later reply through steering.
    """
    request = AgentRequest.objects.select_related("recipient").get(pk=request_id)
    if not request.is_open:
        return actions.outcome(request)
    now = timezone.now()
    if request.wait_deadline is not None and request.wait_deadline > now:
        return (request.wait_deadline - now).total_seconds()
    actions.end_wait(request_id=request_id)
    request.refresh_from_db()
    return actions.outcome(request) if not request.is_open else pending(request_id, timed_out=True)


def reply(user: User, *, request_id: str, payload: Any, error: Any) -> dict[str, Any]:
    request = actions.reply_to_request(request_id=request_id, by=user, payload=payload, error=error)
    return {"request_id": request.pk, "status": request.status}


def cancel_request(user: User, *, request_id: str) -> dict[str, Any]:
    request = actions.cancel_request(request_id=request_id, by=user)
    return {"request_id": request.pk, "status": request.status}


def steering_item(item: SteeringItem) -> dict[str, Any]:
    """One item as `GET /steering/` shows it."""
    request = item.request
    data: dict[str, Any] = {
        "seq": item.seq,
        "kind": item.kind,
        "request_id": item.request_id or item.human_request_id,
        "from": item.sender,
        "type": request.type if request is not None else None,
        "payload": item.payload,
        "created_at": item.created_at.isoformat(),
    }
    if request is not None and item.kind in (SteeringItem.Kind.RESPONSE, SteeringItem.Kind.NOTICE):
        data["status"] = request.status
        if request.error is not None:
            data["error"] = request.error
    return data


def read_steering(user: User, *, after: int) -> tuple[int, dict[str, Any]]:
    """Acknowledge the items up to `after` (they become consumed) and return those after it, with
    the cursor to pass next time. Returns the caller's collaborator id too, for the wake-up channel."""
    if after < 0:
        raise errors.InvalidPayload("Bad cursor.", errors={"after": ["A non-negative integer."]})
    collaborator = me(user)
    actions.acknowledge_steering(recipient=collaborator, upto_seq=after)
    items = SteeringItem.objects.filter(recipient=collaborator, seq__gt=after).select_related("request")
    page = [steering_item(item) for item in items.order_by("seq")[:STEERING_PAGE]]
    return collaborator.pk, {"items": page, "cursor": page[-1]["seq"] if page else after}


def ask_human(user: User, *, title: str, fields: Any, to: str | None, idempotency_key: str) -> dict[str, Any]:
    form, _ = actions.ask_human(asker=me(user), title=title, fields=fields, to=to, idempotency_key=idempotency_key)
    return {"human_request_id": form.pk, "status": form.status}


def finish(user: User) -> dict[str, Any]:
    """The agent's run is over; requests still waiting on it fail with `recipient_unavailable`."""
    run = actions.set_external_status(run_id=me(user).run.pk, status="finished", by=user)
    return {"run_id": run.pk, "status": run.status}


def max_wait_s() -> float:
    return float(settings.AGORA_STEERING_POLL_MAX_S)
