"""ask_agent and its outcomes: durable requests from sender to recipient, and their terminal states."""

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from config.sql import columns, db_value, fetch_one, insert, literals, update
from journal.actions import record
from sagas import errors
from sagas.access import ADDRESS_PERM, SagaTree, address_grant_sql, may_address, may_manage
from sagas.actions.locking import check_open, held_saga, lock_saga
from sagas.actions.payloads import body_hash, check_payload
from sagas.actions.steering import push_steering, resume_waiter, waits_over_http
from sagas.models import AgentRequest, Collaborator, Run, Saga, SteeringItem
from sagas.wakeups import publish_after_commit, request_channel

TYPE_PATTERN = r"[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*"
TYPE_RE = re.compile(TYPE_PATTERN)  # fullmatch: `$` admits a final newline
TYPE_MAX = 100
Status = AgentRequest.Status


@transaction.atomic
def ask_agent(
    *,
    sender: Collaborator,
    to: str,
    type: str,
    payload: Any,
    mode: str = AgentRequest.Mode.ASYNC,
    timeout_s: float | None = None,
    idempotency_key: str = "",
) -> tuple[AgentRequest, bool]:
    """Register a durable request to another agent; returns it and whether it is new.

    The same idempotency key with the same body returns the first request; with another body it
    is an `idempotency_conflict`. A `wait` registers an edge of the waits-for graph until
    `wait_deadline`; one that would close a cycle is refused with `deadlock`.
    """
    if not sender.is_agent:
        raise errors.Forbidden("Only agents ask agents; people steer them.")
    if not isinstance(type, str) or len(type) > TYPE_MAX or not TYPE_RE.fullmatch(type):
        raise errors.InvalidPayload("Bad request type.", errors={"type": ["A short dotted name such as code.review."]})
    if mode not in AgentRequest.Mode.values:
        raise errors.InvalidPayload("Bad mode.", errors={"mode": ["async or wait."]})
    if payload is None:  # the column is NOT NULL: refuse here rather than fail the insert
        raise errors.InvalidPayload("A request needs a payload.", errors={"payload": ["This field is required."]})
    check_payload(payload)
    # JSON booleans are numbers to Python (True == 1): a `timeout_s: true` is refused, not a second.
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s)
    ):
        raise errors.InvalidPayload("Bad timeout.", errors={"timeout_s": ["A number of seconds."]})
    wait_s = min(float(settings.AGORA_DEFAULT_WAIT_S if timeout_s is None else timeout_s), settings.AGORA_MAX_WAIT_S)
    if wait_s <= 0:
        raise errors.InvalidPayload("Bad timeout.", errors={"timeout_s": ["Must be positive."]})
    # A wait's timeout is its body's too (a body without one hashes as it always has); async has none.
    given = {"timeout_s": timeout_s} if mode == AgentRequest.Mode.WAIT and timeout_s is not None else {}
    digest = body_hash(to=to, type=type, payload=payload, mode=mode, **given)
    saga = lock_saga(sender.saga_id)
    facts = read_ask(saga, sender, to.partition(":")[2], idempotency_key)
    check_open(facts.saga_status)  # as lock_open_saga() would, with the status read just now
    if facts.key_used:  # a key that was used before answers with its request, whatever has changed since
        return replay(sender, idempotency_key, digest), False
    if facts.sender_status in Run.FINISHED:  # as for its forms; a resumable one reports `working` first
        raise errors.InvalidState(f"{sender.handle} has ended ({facts.sender_status}): it asks no more.")
    now = timezone.now()
    recipient, hop = check_ask(saga, sender, to, mode, facts, now=now)
    run = recipient.run
    request = AgentRequest(
        saga=saga, sender=sender, recipient=recipient, type=type, payload=payload, mode=mode,
        idempotency_key=idempotency_key, body_hash=digest, hop=hop,
        wait_deadline=now + timedelta(seconds=wait_s) if mode == AgentRequest.Mode.WAIT else None,
        expires_at=now + timedelta(seconds=settings.AGORA_REQUEST_TTL_S),
    )  # fmt: skip
    # Nobody waits for it: the saga's lock keeps the key as unused as read_ask() found it.
    insert(request, later=True)
    # A finished run reaching this point is resumable: the new request restarts it.
    resumed = run.is_finished and Run.objects.filter(pk=run.pk, status__in=Run.FINISHED).update(status=Run.Status.IDLE)
    push_steering(
        recipient=recipient, kind=SteeringItem.Kind.REQUEST, sender=sender.handle, request=request, payload=payload,
        later=True,
    )  # fmt: skip
    record(
        saga_id=saga.pk,
        type="request.created",
        actor=sender.handle,
        run_id=sender_run_id(sender),
        data={"request_id": request.pk, "to": recipient.handle, "type": type, "mode": mode, "hop": hop,
              "payload": payload},
    )  # fmt: skip
    if resumed:
        record(
            saga_id=saga.pk,
            type="run.resumed",
            actor=sender.handle,
            run_id=run.pk,
            data={"previous_status": run.status, "request_id": request.pk},
        )
    return request, True


@dataclass(frozen=True)
class AskFacts:
    """What one ask reads, in one statement (it runs on every ask, _ASK_SQL)."""

    saga_status: str  # read under the saga's lock, whatever copy of the saga the caller holds
    recipient: Collaborator | None  # the saga's agent of that name, with its run
    granted: bool  # whether the sender holds the `address_collaborator` grant on it
    sent: int  # the sender's open requests
    deepest: int | None  # the deepest hop among the open requests the sender received
    backlog: int  # the recipient's unread steering
    key_used: bool  # whether the sender made a request with this idempotency key before
    sender_status: str | None  # the sender's run's (finish_run() changes it under the same lock)


def read_ask(saga: Saga, sender: Collaborator, name: str, idempotency_key: str = "") -> AskFacts:
    """What check_ask() and check_open() decide on, for an ask of the agent `name`."""
    params = [
        sender.user_id, ADDRESS_PERM, sender.pk, sender.pk, sender.pk, idempotency_key or None, sender.pk,
        Collaborator.Kind.AGENT.value, name, db_value(Saga, "id", saga.pk),
    ]  # fmt: skip
    row = fetch_one(_ASK_SQL, params, Collaborator, Run, plain=7)
    if row is None:  # the saga row itself is gone (deleted)
        raise errors.NotFound(f"No saga {saga.pk}.")
    status, granted, sent, deepest, backlog, key_used, sender_status, collaborator, run = row
    if collaborator is not None and run is not None:
        run.collaborator = collaborator  # and collaborator.run is run
    recipient = collaborator if run is not None else None
    return AskFacts(status, recipient, bool(granted), sent, deepest, backlog, bool(key_used), sender_status)


_OPEN_STATUSES = [status.value for status in AgentRequest.OPEN]
_OPEN = literals(_OPEN_STATUSES)
# From the saga row, so that its status comes back whether or not the recipient exists (a finished
# saga refuses first). The grant is matched on the recipient's id as text: guardian keeps object
# keys in a text column. The open requests are counted where their index finds them, among the
# sender's (or recipient's) open ones (the statuses written out, for the planner), and the
# idempotency key is looked up where request_idempotency_unique indexes it (its condition, written
# out): every request the sender ever made otherwise.
_ASK_SQL = (
    f"SELECT s.status, EXISTS ({address_grant_sql('CAST(c.id AS TEXT)')}), "
    f"(SELECT COUNT(*) FROM {AgentRequest._meta.db_table} WHERE sender_id = %s AND status IN ({_OPEN})), "
    f"(SELECT MAX(hop) FROM {AgentRequest._meta.db_table} WHERE recipient_id = %s AND status IN ({_OPEN})), "
    f"(SELECT COUNT(*) FROM {SteeringItem._meta.db_table} WHERE recipient_id = c.id AND consumed_at IS NULL), "
    f"EXISTS (SELECT 1 FROM {AgentRequest._meta.db_table} WHERE sender_id = %s AND idempotency_key = %s "
    "AND NOT (idempotency_key = '')), "
    f"(SELECT status FROM {Run._meta.db_table} WHERE collaborator_id = %s), "
    f"{columns(Collaborator, 'c')}, {columns(Run, 'r')} FROM {Saga._meta.db_table} s "
    f"LEFT JOIN {Collaborator._meta.db_table} c ON c.saga_id = s.id AND c.kind = %s AND c.name = %s "
    f"LEFT JOIN {Run._meta.db_table} r ON r.collaborator_id = c.id WHERE s.id = %s"
)


def check_ask(
    saga: Saga, sender: Collaborator, to: str, mode: str, facts: AskFacts, *, now: Any
) -> tuple[Collaborator, int]:
    """Whether sender may ask `to` now: visible, addressable, available, within the limits, as
    read_ask() found. Returns the recipient (with its run) and the new request's hop."""
    kind = to.partition(":")[0]
    if kind == Collaborator.Kind.HUMAN:
        raise errors.InvalidPayload(
            "ask_agent addresses agents; a person is asked with ask_human (POST /sagas/{id}/human-requests/).",
            errors={"to": ["An agent: agent:<name>."]},
        )
    recipient = facts.recipient if kind == Collaborator.Kind.AGENT else None  # an agent of that name
    if recipient is None:
        raise errors.NotFound(f"No collaborator {to} in this saga.")
    if recipient.pk == sender.pk:
        raise errors.InvalidPayload("An agent cannot ask itself.", errors={"to": ["That is you."]})
    # The address grants follow the saga tree (written as agents join) and every agent one may address
    # is one it sees: a grant settles it. Only a refusal needs the tree, to tell an agent the
    # sender cannot see (404, as for one that does not exist) from one it may not address.
    if not may_address(sender, recipient, granted=facts.granted):
        if recipient.pk not in SagaTree.shape(saga).visible_ids(sender):
            raise errors.NotFound(f"No collaborator {to} in this saga.")
        raise errors.NotAddressable(f"The saga's {saga.policy} policy does not let {sender.handle} address {to}.")
    if recipient.run.is_finished and not recipient.run.resumable:
        raise errors.RecipientUnavailable(f"{to} has {recipient.run.status} and cannot resume.")
    if facts.sent >= settings.AGORA_MAX_PENDING_PER_SENDER:
        raise errors.TooManyPending(
            f"{sender.handle} already has {settings.AGORA_MAX_PENDING_PER_SENDER} open requests."
        )
    hop = (facts.deepest or 0) + 1
    if hop > settings.AGORA_MAX_HOPS:
        raise errors.HopLimit(f"This would be hop {hop}; the limit is {settings.AGORA_MAX_HOPS}.")
    if facts.backlog >= settings.AGORA_MAX_STEERING_BACKLOG:
        raise errors.TooManyPending(f"{recipient.handle} has {facts.backlog} unread steering items.")
    if mode == AgentRequest.Mode.WAIT:
        check_no_cycle(saga, sender, recipient, now=now)
    return recipient, hop


def sender_run_id(collaborator: Collaborator) -> str:
    try:
        return str(collaborator.run.pk)  # often loaded with the collaborator (a turn's own run)
    except Run.DoesNotExist:
        return ""


def replay(sender: Collaborator, key: str, digest: str) -> AgentRequest:
    """The sender's request made with this key, if it was for the same body."""
    first = AgentRequest.objects.get(sender=sender, idempotency_key=key)
    if first.body_hash != digest:
        raise errors.IdempotencyConflict("This Idempotency-Key was already used for a different request.")
    return first


def check_no_cycle(saga: Saga, sender: Collaborator, recipient: Collaborator, *, now: Any) -> None:
    """Refuse a wait that closes a cycle in the waits-for graph (serialised by the saga lock)."""
    edges: dict[int, list[tuple[int, str]]] = {}
    waits = AgentRequest.objects.filter(saga=saga, status__in=AgentRequest.OPEN, wait_deadline__gt=now)
    for request_id, waiter, awaited in waits.values_list("pk", "sender_id", "recipient_id"):
        edges.setdefault(waiter, []).append((awaited, request_id))
    path = find_path(edges, recipient.pk, sender.pk)
    if path is None:
        return
    names = dict(Collaborator.objects.filter(saga=saga).values_list("pk", "name"))
    kinds = dict(Collaborator.objects.filter(saga=saga).values_list("pk", "kind"))
    steps = [f"{sender.handle} → {recipient.handle} (this request)"]
    steps += [f"→ {kinds[node]}:{names[node]} ({request_id})" for node, request_id in path]
    raise errors.Deadlock(
        " ".join(steps), cycle=[sender.handle, recipient.handle] + [f"{kinds[n]}:{names[n]}" for n, _ in path]
    )


def find_path(edges: dict[int, list[tuple[int, str]]], start: int, goal: int) -> list[tuple[int, str]] | None:
    """A path start → … → goal as [(node, request_id), …], by depth-first search."""
    stack: list[tuple[int, list[tuple[int, str]]]] = [(start, [])]
    seen = {start}
    while stack:
        node, path = stack.pop()
        for nxt, request_id in edges.get(node, []):
            if nxt == goal:
                return [*path, (nxt, request_id)]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, (nxt, request_id)]))
    return None


def request_visible_to(request: AgentRequest, user: User) -> bool:
    return user.pk in (request.sender.user_id, request.recipient.user_id) or may_manage(user, request.saga)


def get_request_for(user: User, request_id: str) -> AgentRequest:
    """The request if user is its sender, recipient or a manager of its saga; else 404."""
    row = fetch_one(_REQUEST_SQL, [request_id], AgentRequest, Collaborator, Collaborator, Run)
    if row is not None:
        request, request.sender, request.recipient, run = row
        if run is not None:  # the reply's wake-up reads it (steering.ring_before_commit)
            run.collaborator = request.sender
        if request_visible_to(request, user):
            return request
    raise errors.NotFound(f"No request {request_id}.")


_REQUEST_SQL = (
    f"SELECT {columns(AgentRequest, 'q')}, {columns(Collaborator, 's')}, {columns(Collaborator, 'r')}, "
    f"{columns(Run, 'sr')} FROM {AgentRequest._meta.db_table} q "
    f"JOIN {Collaborator._meta.db_table} s ON s.id = q.sender_id "
    f"JOIN {Collaborator._meta.db_table} r ON r.id = q.recipient_id "
    f"LEFT JOIN {Run._meta.db_table} sr ON sr.collaborator_id = s.id WHERE q.id = %s"
)


def closed_error(request: AgentRequest) -> errors.KernelError:
    if request.status == Status.CANCELLED:
        return errors.RequestCancelled(f"{request.pk} was cancelled by its sender.")
    if request.status in (Status.COMPLETED, Status.FAILED):
        return errors.AlreadyAnswered(f"{request.pk} was already answered.")
    return errors.RequestClosed(f"{request.pk} is {request.status}.", status=request.status)


@transaction.atomic
def reply_to_request(*, request_id: str, by: User, payload: Any = None, error: Any = None) -> AgentRequest:
    """The recipient's one reply (a payload, or an error that fails the request)."""
    request = get_request_for(by, request_id)
    read_under_lock = held_saga(request.saga_id) is not None  # a turn's: its status stays as read
    lock_saga(request.saga_id)
    if request.recipient.user_id != by.pk:
        raise errors.Forbidden("Only the recipient replies to a request.")
    if (payload is None) == (error is None):
        raise errors.InvalidPayload(
            "Send a payload or an error.", errors={"payload": ["Exactly one of payload or error."]}
        )
    check_payload(payload if error is None else error)
    status = Status.COMPLETED if error is None else Status.FAILED
    err = None if error is None else normalise_error(error)
    if not settle(request, status, later=read_under_lock, reply=payload, error=err):
        request.refresh_from_db()
        raise closed_error(request)
    close_request(request, actor=request.recipient.handle, notify_recipient=False)
    return request


def normalise_error(error: Any) -> dict[str, Any]:
    if isinstance(error, dict):
        return {"code": str(error.get("code", "error")), "message": str(error.get("message", ""))}
    return {"code": "error", "message": str(error)}


def settle(request: AgentRequest, status: str, *, later: bool = False, **fields: Any) -> bool:
    """Compare-and-set an open request to a terminal status. The one that wins also updates the
    object it holds (loaded with its sender and recipient, which close_request() reads). With
    `later`, for a request read under its saga's lock (which every writer of requests takes): its
    status decides, and nothing waits for the UPDATE (config.sql.defer)."""
    if later and request.status not in AgentRequest.OPEN:
        return False
    changes = {"status": status, "wait_deadline": None, "updated_at": timezone.now(), **fields}
    if not update(AgentRequest, {"id": request.pk, "status": _OPEN_STATUSES}, later=later, **changes):
        return False
    for name, value in changes.items():
        setattr(request, name, value)
    return True


def close_request(request: AgentRequest, *, actor: str, notify_recipient: bool) -> None:
    """After a request's terminal transition: tell the sender (and maybe the recipient), resume
    a parked sender, journal it."""
    body = outcome(request)
    kind = (
        SteeringItem.Kind.RESPONSE if request.status in (Status.COMPLETED, Status.FAILED) else SteeringItem.Kind.NOTICE
    )
    push_steering(
        recipient=request.sender, kind=kind, sender=request.recipient.handle, request=request,
        payload=body["payload"], later=True,
    )  # fmt: skip
    if notify_recipient:
        push_steering(
            recipient=request.recipient, kind=SteeringItem.Kind.NOTICE, sender=request.sender.handle, request=request,
            payload={"status": request.status}, later=True,
        )  # fmt: skip
    if request.mode == AgentRequest.Mode.WAIT:  # only a wait parks its sender's run
        resume_waiter(request=request)
    if waits_over_http(request.sender):
        publish_after_commit(request_channel(request.pk))
    record(
        saga_id=request.saga_id,
        type=f"request.{request.status}",
        actor=actor,
        data={"request_id": request.pk, "from": request.sender.handle, "to": request.recipient.handle,
              "status": request.status, "payload": body["payload"], "error": request.error},
    )  # fmt: skip


def outcome(request: AgentRequest, *, by: str = "") -> dict[str, Any]:
    """What the sender learns: the seed's result shape. `by`: the recipient's handle, where the
    caller knows it without the request's recipient."""
    body: dict[str, Any] = {"request_id": request.pk, "status": request.status, "from": by or request.recipient.handle}
    body["payload"] = request.reply if request.status == Status.COMPLETED else None
    if request.error:
        body["error"] = request.error
    return body


@transaction.atomic
def cancel_request(*, request_id: str, by: User) -> AgentRequest:
    """The sender withdraws its request; cancelling twice is fine, a late reply is refused."""
    request = get_request_for(by, request_id)
    lock_saga(request.saga_id)
    if request.sender.user_id != by.pk:
        raise errors.Forbidden("Only the sender cancels a request.")
    if not settle(request, Status.CANCELLED):
        request.refresh_from_db()
        if request.status == Status.CANCELLED:
            return request
        raise closed_error(request)
    close_request(request, actor=request.sender.handle, notify_recipient=True)
    return request


def end_wait(*, request_id: str) -> bool:
    """The sender stops waiting (its timeout passed): the edge leaves the waits-for graph and a
    parked run resumes with `timed_out`. The request itself stays open."""
    with transaction.atomic():
        request = AgentRequest.objects.select_related("sender").filter(pk=request_id).first()
        if request is None:
            return False
        lock_saga(request.saga_id)
        if not AgentRequest.objects.filter(pk=request_id, wait_deadline__isnull=False).update(wait_deadline=None):
            return False
        resume_waiter(request=request)
        record(
            saga_id=request.saga_id,
            type="request.wait_timed_out",
            actor=request.sender.handle,
            data={"request_id": request_id, "status": request.status},
        )
        return True


@transaction.atomic
def expire_request(*, request_id: str) -> bool:
    """Its TTL passed before anyone answered: a terminal `expired` for both sides."""
    request = AgentRequest.objects.select_related("sender", "recipient").filter(pk=request_id).first()
    if request is None:
        return False
    lock_saga(request.saga_id)
    # expires_at never changes once set, and the reconciler asks only for requests past it.
    expired = {"code": Status.EXPIRED.value, "message": f"No reply before {request.expires_at.isoformat()}."}
    if request.expires_at > timezone.now() or not settle(request, Status.EXPIRED, error=expired):
        return False
    close_request(request, actor="system", notify_recipient=True)
    return True


def due_wait_ids(now: Any) -> Iterable[str]:
    return AgentRequest.objects.filter(wait_deadline__lte=now).values_list("pk", flat=True)[:500]


def due_expiry_ids(now: Any) -> Iterable[str]:
    return AgentRequest.objects.filter(status__in=AgentRequest.OPEN, expires_at__lte=now).values_list("pk", flat=True)[
        :500
    ]
