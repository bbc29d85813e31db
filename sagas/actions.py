"""The kernel's writes. Each action locks its saga, changes state, journals it in the same
transaction, and rings doorbells only after commit.

Every action starts by locking the saga row: all of a saga's writes already queue on its journal
head, so taking that place in line first costs nothing and rules out lock-order deadlocks.
"""

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm

from accounts.actions import create_agent_user, issue_token
from accounts.models import User
from agents.models import AgentProfile
from config.sql import columns, db_value, fetch, fetch_one, insert, update
from journal.actions import record
from sagas import errors, forms
from sagas.access import SagaTree, may_address, may_manage, sync_address_grants
from sagas.models import (
    AgentRequest,
    Collaborator,
    Delegation,
    HumanRequest,
    Run,
    Saga,
    SteeringItem,
)
from sagas.wakeups import publish_after_commit, request_channel, ring_run_after_commit, steering_channel

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
TYPE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")
TYPE_MAX = 100
Status = AgentRequest.Status


# The saga whose row lock the current transaction holds, set by saga_transaction(): the actions
# called inside it find the lock taken and do not ask for it again.
_held_lock: ContextVar[Saga | None] = ContextVar("held_saga_lock", default=None)


def lock_saga(saga_id: Any) -> Saga:
    held = _held_lock.get()
    if held is not None and str(held.pk) == str(saga_id):
        return held
    # NO KEY UPDATE: writers of one saga queue here, but inserts that merely reference the saga
    # (journal events, requests) take KEY SHARE on it and must not wait behind us, or a writer
    # holding a journal head while inserting its event deadlocks with us.
    saga = Saga.objects.select_for_update(no_key=True).filter(pk=saga_id).first()
    if saga is None:
        raise errors.NotFound(f"No saga {saga_id}.")
    return saga


@contextmanager
def saga_transaction(saga: Saga) -> Iterator[Saga]:
    """A transaction that takes the saga's lock first and holds it to the end, for callers that
    run several actions in one transaction (a turn of an internal run).

    On SQLite, BEGIN IMMEDIATE has already taken the database's one write lock, and a saga's row
    never changes after it is created: the caller's copy serves, and nothing is read.
    """
    with transaction.atomic():
        if connection.vendor != "sqlite":
            saga = lock_saga(saga.pk)
        token = _held_lock.set(saga)
        try:
            yield saga
        finally:
            _held_lock.reset(token)


def payload_size(payload: Any) -> int:
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


def check_payload(payload: Any, *, field: str = "payload") -> None:
    limit = settings.AGORA_MAX_PAYLOAD_BYTES
    if payload_size(payload) > limit:
        raise errors.PayloadTooLarge(f"Limit is {limit} bytes.", field=field)


# --- sagas and collaborators -------------------------------------------------------------------


@transaction.atomic
def create_saga(*, title: str, goal: str = "", policy: str = Saga.Policy.TREE, owner: User) -> Saga:
    if not title.strip():
        raise errors.InvalidPayload("A saga needs a title.", errors={"title": ["This field may not be blank."]})
    if policy not in Saga.Policy.values:
        raise errors.InvalidPayload(f"Unknown policy {policy!r}.", errors={"policy": [f"One of {Saga.Policy.values}."]})
    saga = Saga.objects.create(title=title, goal=goal, policy=policy, owner=owner)
    for perm in ("sagas.view_saga", "sagas.manage_saga"):
        assign_perm(perm, owner, saga)
    record(
        saga_id=saga.pk,
        type="saga.created",
        actor=f"human:{owner.username}",
        data={"title": title, "goal": goal, "policy": policy},
    )
    Collaborator.objects.create(
        saga=saga, kind=Collaborator.Kind.HUMAN, name=owner.username, role="Owner", task=goal, user=owner
    )
    record(
        saga_id=saga.pk,
        type="collaborator.joined",
        actor=f"human:{owner.username}",
        data={"id": f"human:{owner.username}", "kind": "human", "role": "Owner", "task": goal},
    )
    return saga


def acting_collaborator(saga: Saga, by: User) -> Collaborator | None:
    return Collaborator.objects.filter(saga=saga, user=by).first()


def actor_id(saga: Saga, by: User) -> str:
    """The journal's actor for a principal: its collaborator id, or `human:<username>` for managers."""
    collaborator = acting_collaborator(saga, by)
    return collaborator.handle if collaborator else f"{by.kind}:{by.username}"


@transaction.atomic
def add_agent(
    *,
    saga: Saga,
    name: str,
    role: str,
    task: str,
    runtime: str,
    by: User,
    profile: str = "",
    parent: str | None = None,
    resumable: bool = False,
) -> tuple[Collaborator, str | None]:
    """Add an agent collaborator with its service user, its delegation and its run.

    Managers may add agents anywhere; an agent may add only its own delegates. Returns the
    collaborator and, for an external agent, its API token (shown this once).
    """
    saga = lock_saga(saga.pk)
    acting = acting_collaborator(saga, by)
    if not NAME_RE.match(name):
        raise errors.InvalidPayload(
            "Bad agent name.", errors={"name": ["Lowercase letters, digits, '.', '_' and '-'."]}
        )
    if runtime not in (Collaborator.Runtime.INTERNAL, Collaborator.Runtime.EXTERNAL):
        raise errors.InvalidPayload("Bad runtime.", errors={"runtime": ["internal or external."]})
    if runtime == Collaborator.Runtime.INTERNAL and not profile:
        raise errors.InvalidPayload("An internal agent needs a profile.", errors={"profile": ["Required."]})
    if runtime == Collaborator.Runtime.INTERNAL and not AgentProfile.objects.filter(name=profile).exists():
        raise errors.InvalidPayload(
            f"No agent profile {profile}.",
            errors={"profile": [f"No profile {profile}; `load_profiles` adds profiles."]},
        )
    delegator = resolve_parent(saga, parent, by=by, acting=acting)
    if Collaborator.objects.filter(saga=saga, kind=Collaborator.Kind.AGENT, name=name).exists():
        raise errors.NameTaken(f"agent:{name} is already in this saga.")
    user = create_agent_user(username=f"agent.{saga.pk.hex[:12]}.{name}")
    collaborator = Collaborator.objects.create(
        saga=saga,
        kind=Collaborator.Kind.AGENT,
        name=name,
        role=role,
        task=task,
        user=user,
        runtime=runtime,
        profile=profile,
    )
    Delegation.objects.create(saga=saga, delegator=delegator, delegate=collaborator, task=task)
    internal = runtime == Collaborator.Runtime.INTERNAL
    run = Run.objects.create(
        collaborator=collaborator, status=Run.Status.QUEUED if internal else Run.Status.IDLE, resumable=resumable
    )
    assign_perm("sagas.view_saga", user, saga)
    sync_address_grants(saga)
    actor = acting.handle if acting else f"human:{by.username}"
    record(
        saga_id=saga.pk,
        type="collaborator.joined",
        actor=actor,
        run_id=run.pk,
        data={"id": collaborator.handle, "kind": "agent", "role": role, "task": task, "parent": delegator.handle,
              "runtime": runtime, "profile": profile},
    )  # fmt: skip
    if internal:
        ring_run_after_commit(run.pk)
    token = None if internal else issue_token(user=user)
    return collaborator, token


def resolve_parent(saga: Saga, parent: str | None, *, by: User, acting: Collaborator | None) -> Collaborator:
    """The delegator of a new agent: the named parent, or (for managers) the saga's owner."""
    if not may_manage(by, saga):
        if acting is None or not acting.is_agent:
            raise errors.Forbidden("Only managers of the saga add collaborators.")
        if parent not in (None, acting.handle):
            raise errors.Forbidden("An agent may add only its own delegates.")
        return acting
    if parent is None:
        return Collaborator.objects.get(saga=saga, user=saga.owner)
    found = find_collaborator(saga, parent)
    if found is None:
        raise errors.NotFound(f"No collaborator {parent} in this saga.")
    return found


@transaction.atomic
def add_human(*, saga: Saga, user: User, role: str, task: str, by: User) -> Collaborator:
    saga = lock_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga add collaborators.")
    if user.is_agent:
        raise errors.InvalidPayload("That user is an agent.", errors={"username": ["Not a person."]})
    if Collaborator.objects.filter(saga=saga, user=user).exists():
        raise errors.NameTaken(f"human:{user.username} is already in this saga.")
    collaborator = Collaborator.objects.create(
        saga=saga, kind=Collaborator.Kind.HUMAN, name=user.username, role=role, task=task, user=user
    )
    assign_perm("sagas.view_saga", user, saga)
    record(
        saga_id=saga.pk,
        type="collaborator.joined",
        actor=actor_id(saga, by),
        data={"id": collaborator.handle, "kind": "human", "role": role, "task": task},
    )
    return collaborator


def find_collaborator(saga: Saga, handle: str) -> Collaborator | None:
    kind, _, name = handle.partition(":")
    if kind not in Collaborator.Kind.values or not name:
        return None
    return Collaborator.objects.filter(saga=saga, kind=kind, name=name).select_related("run", "user").first()


# --- steering ----------------------------------------------------------------------------------


# Every request and reply goes through push_steering(): plain statements for its two updates.
_NEXT_STEERING_SEQ_SQL = (
    f"UPDATE {Collaborator._meta.db_table} SET steering_seq = steering_seq + 1 WHERE id = %s RETURNING steering_seq"
)
_WAKE_SQL = f"UPDATE {Run._meta.db_table} SET status = %s WHERE collaborator_id = %s AND status = %s RETURNING id"


def push_steering(
    *,
    recipient: Collaborator,
    kind: str,
    sender: str,
    request: AgentRequest | None = None,
    human_request: HumanRequest | None = None,
    payload: Any = None,
) -> SteeringItem:
    """Append to the recipient's steering and wake it after commit; never interrupts a running turn."""
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_STEERING_SEQ_SQL, [recipient.pk])
        (seq,) = cursor.fetchone()
    item = insert(SteeringItem(
        recipient=recipient, seq=seq, kind=kind, sender=sender, request=request, human_request=human_request,
        payload=payload,
    ))  # fmt: skip
    wake(recipient)
    return item


def waits_over_http(collaborator: Collaborator) -> bool:
    """Whether collaborator may be waiting on Agora over HTTP (a steering long-poll, an ask in
    `wait` mode), which a ping after commit wakes. An internal agent never is: Celery rings its
    turns, and a ping for nobody costs the committing turn about a millisecond."""
    return collaborator.runtime != Collaborator.Runtime.INTERNAL


def wake(collaborator: Collaborator) -> None:
    """An idle internal run gets a turn; a running one finds the item when its turn ends; anyone
    else may be long-polling its steering."""
    if waits_over_http(collaborator):
        publish_after_commit(steering_channel(collaborator.pk))
        return
    with connection.cursor() as cursor:
        cursor.execute(_WAKE_SQL, [Run.Status.QUEUED.value, collaborator.pk, Run.Status.IDLE.value])
        woken = cursor.fetchone()
    if woken:
        ring_run_after_commit(woken[0])


def resume_waiter(request: AgentRequest) -> None:
    """A run parked on this request gets its next turn, which reads the outcome."""
    for run_id in Run.objects.filter(status=Run.Status.WAITING, waiting_on=request).values_list("pk", flat=True):
        if Run.objects.filter(pk=run_id, status=Run.Status.WAITING).update(status=Run.Status.QUEUED, wait_until=None):
            ring_run_after_commit(run_id)


def check_backlog(recipient: Collaborator) -> None:
    backlog = SteeringItem.objects.filter(recipient=recipient, consumed_at__isnull=True).count()
    if backlog >= settings.AGORA_MAX_STEERING_BACKLOG:
        raise errors.TooManyPending(f"{recipient.handle} has {backlog} unread steering items.")


# The turn's own steps (consume_steering, park_on_request, end_turn) join the caller's transaction
# without a savepoint: a failure in one of them fails the turn whole.
@transaction.atomic(savepoint=False)
def consume_steering(
    *, recipient: Collaborator, upto_seq: int | None = None, turn: int | None = None
) -> list[SteeringItem]:
    """Mark the recipient's unread items (up to `upto_seq`) consumed, by `turn` for internal runs.

    Called in the transaction that records the turn's input, so a crash before it leaves them
    unread. Requests among them become `delivered`.
    """
    lock_saga(recipient.saga_id)
    upto, params = ("", [recipient.pk]) if upto_seq is None else (" AND i.seq <= %s", [recipient.pk, upto_seq])
    rows = fetch(_UNREAD_SQL.format(upto=upto), params, SteeringItem, AgentRequest)
    if not rows:
        return []
    for item, request in rows:
        item.request = request
    consumed: list[SteeringItem] = [item for item, _ in rows]
    now = timezone.now()
    update(SteeringItem, {"id": [i.pk for i in consumed]}, consumed_at=now, consumed_turn=turn)
    for item in consumed:
        item.consumed_at, item.consumed_turn = now, turn
    requests = [i.request_id for i in consumed if i.kind == SteeringItem.Kind.REQUEST and i.request_id]
    if requests:
        # The compare-and-set alone decides which of them this delivers.
        with connection.cursor() as cursor:
            ids = ", ".join(["%s"] * len(requests))
            cursor.execute(_DELIVER_SQL.format(ids=ids), [Status.DELIVERED.value, Status.PENDING.value, *requests])
            delivered = {row[0] for row in cursor.fetchall()}
        for request_id in (r for r in requests if r in delivered):  # in steering order
            record(saga_id=recipient.saga_id, type="request.delivered", actor=recipient.handle,
                   data={"request_id": request_id})  # fmt: skip
    return consumed


_UNREAD_SQL = (
    f"SELECT {columns(SteeringItem, 'i')}, {columns(AgentRequest, 'q')} FROM {SteeringItem._meta.db_table} i "
    f"LEFT JOIN {AgentRequest._meta.db_table} q ON q.id = i.request_id "
    "WHERE i.recipient_id = %s AND i.consumed_at IS NULL{upto} ORDER BY i.seq"
)
_DELIVER_SQL = (
    f"UPDATE {AgentRequest._meta.db_table} SET status = %s WHERE status = %s AND id IN ({{ids}}) RETURNING id"
)


@transaction.atomic
def steer(*, saga: Saga, to: Collaborator, message: Any, by: User) -> SteeringItem:
    """A manager's message to an agent, delivered at its next turn boundary."""
    saga = lock_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga steer its agents.")
    if to.saga_id != saga.pk:  # managing one saga gives no reach into another
        raise errors.NotFound(f"No collaborator {to.handle} in this saga.")
    if not to.is_agent:
        raise errors.InvalidPayload("Steer agents; ask people through forms.", errors={"to": ["Not an agent."]})
    check_payload(message, field="message")
    check_backlog(to)
    sender = actor_id(saga, by)
    item = push_steering(recipient=to, kind=SteeringItem.Kind.MESSAGE, sender=sender, payload=message)
    record(saga_id=saga.pk, type="steering.message", actor=sender, data={"to": to.handle, "seq": item.seq})
    return item


# --- ask_agent and its outcomes ----------------------------------------------------------------


def body_hash(**body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


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
    if not isinstance(type, str) or len(type) > TYPE_MAX or not TYPE_RE.match(type):
        raise errors.InvalidPayload("Bad request type.", errors={"type": ["A short dotted name such as code.review."]})
    if mode not in AgentRequest.Mode.values:
        raise errors.InvalidPayload("Bad mode.", errors={"mode": ["async or wait."]})
    if payload is None:  # the column is NOT NULL: refuse here rather than fail the insert
        raise errors.InvalidPayload("A request needs a payload.", errors={"payload": ["This field is required."]})
    check_payload(payload)
    wait_s = min(float(settings.AGORA_DEFAULT_WAIT_S if timeout_s is None else timeout_s), settings.AGORA_MAX_WAIT_S)
    if wait_s <= 0:
        raise errors.InvalidPayload("Bad timeout.", errors={"timeout_s": ["Must be positive."]})
    digest = body_hash(to=to, type=type, payload=payload, mode=mode)
    saga = lock_saga(sender.saga_id)
    now = timezone.now()
    try:
        recipient, hop = check_ask(saga, sender, to, mode, now=now)
    except errors.KernelError:
        # A key that was used before answers with its request, whatever has changed since.
        if idempotency_key and (first := replay(sender, idempotency_key, digest)):
            return first, False
        raise
    run = recipient.run
    request = AgentRequest(
        saga=saga, sender=sender, recipient=recipient, type=type, payload=payload, mode=mode,
        idempotency_key=idempotency_key, body_hash=digest, hop=hop,
        wait_deadline=now + timedelta(seconds=wait_s) if mode == AgentRequest.Mode.WAIT else None,
        expires_at=now + timedelta(seconds=settings.AGORA_REQUEST_TTL_S),
    )  # fmt: skip
    try:
        with transaction.atomic():
            insert(request)
    except IntegrityError:  # its key was used before: answer with that request (or a conflict)
        first = replay(sender, idempotency_key, digest) if idempotency_key else None
        if first is None:
            raise
        return first, False
    # A finished run reaching this point is resumable: the new request restarts it.
    resumed = run.is_finished and Run.objects.filter(pk=run.pk, status__in=Run.FINISHED).update(status=Run.Status.IDLE)
    push_steering(
        recipient=recipient, kind=SteeringItem.Kind.REQUEST, sender=sender.handle, request=request, payload=payload
    )
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


# What the limits of one ask read, in one statement (it runs on every ask): the sender's open
# requests, the deepest hop among the open requests it received, the recipient's unread steering.
_OPEN_STATUSES = [status.value for status in AgentRequest.OPEN]
_OPEN = ", ".join(["%s"] * len(_OPEN_STATUSES))
_LIMITS_SQL = (
    f"SELECT (SELECT COUNT(*) FROM {AgentRequest._meta.db_table} WHERE sender_id = %s AND status IN ({_OPEN})), "
    f"(SELECT MAX(hop) FROM {AgentRequest._meta.db_table} WHERE recipient_id = %s AND status IN ({_OPEN})), "
    f"(SELECT COUNT(*) FROM {SteeringItem._meta.db_table} WHERE recipient_id = %s AND consumed_at IS NULL)"
)


def check_ask(saga: Saga, sender: Collaborator, to: str, mode: str, *, now: Any) -> tuple[Collaborator, int]:
    """Whether sender may ask `to` now: visible, addressable, available, within the limits.
    Returns the recipient (with its run) and the new request's hop."""
    kind, _, name = to.partition(":")
    recipient = agent_with_run(saga, name) if kind == Collaborator.Kind.AGENT else None
    if recipient is None:
        raise errors.NotFound(f"No collaborator {to} in this saga.")
    if recipient.pk == sender.pk:
        raise errors.InvalidPayload("An agent cannot ask itself.", errors={"to": ["That is you."]})
    # The address grants follow the saga tree (sync_address_grants) and every agent one may address
    # is one it sees: a grant settles it. Only a refusal needs the tree, to tell an agent the
    # sender cannot see (404, as for one that does not exist) from one it may not address.
    if not may_address(sender, recipient):
        if recipient.pk not in SagaTree.load(saga).visible_ids(sender):
            raise errors.NotFound(f"No collaborator {to} in this saga.")
        raise errors.NotAddressable(f"The saga's {saga.policy} policy does not let {sender.handle} address {to}.")
    if recipient.run.is_finished and not recipient.run.resumable:
        raise errors.RecipientUnavailable(f"{to} has {recipient.run.status} and cannot resume.")
    with connection.cursor() as cursor:
        cursor.execute(_LIMITS_SQL, [sender.pk, *_OPEN_STATUSES, sender.pk, *_OPEN_STATUSES, recipient.pk])
        sent, deepest, backlog = cursor.fetchone()
    if sent >= settings.AGORA_MAX_PENDING_PER_SENDER:
        raise errors.TooManyPending(
            f"{sender.handle} already has {settings.AGORA_MAX_PENDING_PER_SENDER} open requests."
        )
    hop = (deepest or 0) + 1
    if hop > settings.AGORA_MAX_HOPS:
        raise errors.HopLimit(f"This would be hop {hop}; the limit is {settings.AGORA_MAX_HOPS}.")
    if backlog >= settings.AGORA_MAX_STEERING_BACKLOG:
        raise errors.TooManyPending(f"{recipient.handle} has {backlog} unread steering items.")
    if mode == AgentRequest.Mode.WAIT:
        check_no_cycle(saga, sender, recipient, now=now)
    return recipient, hop


def agent_with_run(saga: Saga, name: str) -> Collaborator | None:
    """The saga's agent of that name, with its run."""
    params = [db_value(Collaborator, "saga", saga.pk), Collaborator.Kind.AGENT.value, name]
    row = fetch_one(_AGENT_WITH_RUN_SQL, params, Collaborator, Run)
    if row is None:
        return None
    collaborator, run = row
    run.collaborator = collaborator  # and collaborator.run is run
    return collaborator


_AGENT_WITH_RUN_SQL = (
    f"SELECT {columns(Collaborator, 'c')}, {columns(Run, 'r')} FROM {Collaborator._meta.db_table} c "
    f"JOIN {Run._meta.db_table} r ON r.collaborator_id = c.id WHERE c.saga_id = %s AND c.kind = %s AND c.name = %s"
)


def sender_run_id(collaborator: Collaborator) -> str:
    try:
        return str(collaborator.run.pk)  # often loaded with the collaborator (a turn's own run)
    except Run.DoesNotExist:
        return ""


def replay(sender: Collaborator, key: str, digest: str) -> AgentRequest | None:
    first = AgentRequest.objects.filter(sender=sender, idempotency_key=key).first()
    if first is not None and first.body_hash != digest:
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
    row = fetch_one(_REQUEST_SQL, [request_id], AgentRequest, Collaborator, Collaborator)
    if row is not None:
        request, request.sender, request.recipient = row[0], row[1], row[2]
        if request_visible_to(request, user):
            return request
    raise errors.NotFound(f"No request {request_id}.")


_REQUEST_SQL = (
    f"SELECT {columns(AgentRequest, 'q')}, {columns(Collaborator, 's')}, {columns(Collaborator, 'r')} "
    f"FROM {AgentRequest._meta.db_table} q JOIN {Collaborator._meta.db_table} s ON s.id = q.sender_id "
    f"JOIN {Collaborator._meta.db_table} r ON r.id = q.recipient_id WHERE q.id = %s"
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
    lock_saga(request.saga_id)
    if request.recipient.user_id != by.pk:
        raise errors.Forbidden("Only the recipient replies to a request.")
    if (payload is None) == (error is None):
        raise errors.InvalidPayload("Send a payload or an error.", errors={"payload": ["payload or error, not both."]})
    check_payload(payload if error is None else error)
    status = Status.COMPLETED if error is None else Status.FAILED
    err = None if error is None else normalise_error(error)
    if not settle(request, status, reply=payload, error=err):
        request.refresh_from_db()
        raise closed_error(request)
    close_request(request, actor=request.recipient.handle, notify_recipient=False)
    return request


def normalise_error(error: Any) -> dict[str, Any]:
    if isinstance(error, dict):
        return {"code": str(error.get("code", "error")), "message": str(error.get("message", ""))}
    return {"code": "error", "message": str(error)}


def settle(request: AgentRequest, status: str, **fields: Any) -> bool:
    """Compare-and-set an open request to a terminal status. The one that wins also updates the
    object it holds (loaded with its sender and recipient, which close_request() reads)."""
    changes = {"status": status, "wait_deadline": None, "updated_at": timezone.now(), **fields}
    if not update(AgentRequest, {"id": request.pk, "status": _OPEN_STATUSES}, **changes):
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
        recipient=request.sender, kind=kind, sender=request.recipient.handle, request=request, payload=body["payload"]
    )
    if notify_recipient:
        push_steering(
            recipient=request.recipient, kind=SteeringItem.Kind.NOTICE, sender=request.sender.handle, request=request,
            payload={"status": request.status},
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


def outcome(request: AgentRequest) -> dict[str, Any]:
    """What the sender learns: the seed's result shape."""
    body: dict[str, Any] = {"request_id": request.pk, "status": request.status, "from": request.recipient.handle}
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
    if request.expires_at > timezone.now() or not settle(request, Status.EXPIRED):
        return False
    close_request(request, actor="system", notify_recipient=True)
    return True


# --- runs --------------------------------------------------------------------------------------


@transaction.atomic
def finish_run(*, run: Run, status: str, result: Any = None, error: str = "", actor: str | None = None) -> bool:
    """A run's terminal transition. Every open request addressed to it becomes
    `recipient_unavailable` in the same transaction, and each sender is told."""
    collaborator = run.collaborator
    lock_saga(collaborator.saga_id)
    if status not in Run.FINISHED:
        raise errors.InvalidPayload(f"{status} is not a terminal run status.")
    if not Run.objects.filter(pk=run.pk).exclude(status__in=Run.FINISHED).update(
        status=status, result=result, error=error, lease_until=None, waiting_on=None,
        wait_until=None,
    ):  # fmt: skip
        return False
    Delegation.objects.filter(delegate=collaborator).update(status=DELEGATION_STATUS.get(status, "cancelled"))
    AgentRequest.objects.filter(sender=collaborator, wait_deadline__isnull=False).update(wait_deadline=None)
    stranded = AgentRequest.objects.filter(recipient=collaborator, status__in=AgentRequest.OPEN)
    for request in stranded.select_related("sender", "recipient"):
        if settle(request, Status.RECIPIENT_UNAVAILABLE):
            close_request(request, actor=collaborator.handle, notify_recipient=False)
    record(
        saga_id=collaborator.saga_id,
        type=f"run.{status}",
        actor=actor or collaborator.handle,
        run_id=run.pk,
        data={"result": result, "error": error},
    )
    return True


DELEGATION_STATUS: dict[str, str] = {
    Run.Status.COMPLETED: Delegation.Status.COMPLETED,
    Run.Status.FAILED: Delegation.Status.FAILED,
}
EXTERNAL_STATUS = {"working": Run.Status.RUNNING, "idle": Run.Status.IDLE, "finished": Run.Status.COMPLETED}


@transaction.atomic
def set_external_status(*, run_id: str, status: str, by: User) -> Run:
    """An external agent reports `working`, `idle` or `finished` for its own run."""
    run = Run.objects.select_related("collaborator").filter(pk=run_id, collaborator__user=by).first()
    if run is None:
        raise errors.NotFound(f"No run {run_id}.")
    if run.collaborator.runtime != Collaborator.Runtime.EXTERNAL:
        raise errors.Forbidden("Agora runs this agent's turns itself.")
    if status not in EXTERNAL_STATUS:
        raise errors.InvalidPayload("Bad status.", errors={"status": [f"One of {sorted(EXTERNAL_STATUS)}."]})
    target = EXTERNAL_STATUS[status]
    if target == Run.Status.COMPLETED:
        finish_run(run=run, status=target)
    else:
        lock_saga(run.collaborator.saga_id)
        if run.is_finished and not run.resumable:
            raise errors.InvalidState(f"{run_id} has {run.status}.")
        if Run.objects.filter(pk=run.pk).exclude(status=target).update(status=target):
            record(saga_id=run.collaborator.saga_id, type=f"run.{target}", actor=run.collaborator.handle, run_id=run.pk)
    run.refresh_from_db()
    return run


# --- ask_human ---------------------------------------------------------------------------------


@transaction.atomic
def ask_human(
    *, asker: Collaborator, title: str, fields: Any, to: str | None = None, idempotency_key: str = ""
) -> tuple[HumanRequest, bool]:
    """Ask a person of the saga to fill in a form; the answer reaches the asker's steering. The same
    idempotency key with the same form returns the first one; with another, `idempotency_conflict`."""
    if not asker.is_agent:
        raise errors.Forbidden("Only agents ask people through forms.")
    schema = forms.check_schema(fields)
    if not isinstance(title, str) or not title.strip() or len(title) > 200:
        raise errors.InvalidPayload("Bad title.", errors={"title": ["1 to 200 characters."]})
    saga = lock_saga(asker.saga_id)
    addressee = find_collaborator(saga, to) if to else Collaborator.objects.get(saga=saga, user=saga.owner)
    if addressee is None or addressee.is_agent:
        raise errors.NotFound(f"No person {to} in this saga.")
    if idempotency_key and (first := HumanRequest.objects.filter(asker=asker, idempotency_key=idempotency_key).first()):
        if (first.addressee_id, first.title, first.fields) != (addressee.pk, title, schema):
            raise errors.IdempotencyConflict("This Idempotency-Key was already used for a different form.")
        return first, False
    human_request = HumanRequest.objects.create(
        saga=saga, asker=asker, addressee=addressee, title=title, fields=schema, idempotency_key=idempotency_key
    )
    record(
        saga_id=saga.pk,
        type="human_request.created",
        actor=asker.handle,
        run_id=sender_run_id(asker),
        data={"human_request_id": human_request.pk, "to": addressee.handle, "title": title, "fields": schema},
    )
    return human_request, True


@transaction.atomic
def answer_human_request(*, human_request_id: str, answer: Any, by: User) -> HumanRequest:
    """The addressed person's answer, validated against the form; the first valid answer closes it."""
    human_request = (
        HumanRequest.objects.select_related("saga", "asker", "addressee").filter(pk=human_request_id).first()
    )
    if human_request is None or not visible_human_request(human_request, by):
        raise errors.NotFound(f"No form {human_request_id}.")
    lock_saga(human_request.saga_id)
    if human_request.addressee.user_id != by.pk:
        raise errors.Forbidden("Only the person it is addressed to answers a form.")
    clean = forms.check_answer(human_request.fields, answer)
    if not HumanRequest.objects.filter(pk=human_request.pk, status=HumanRequest.Status.PENDING).update(
        status=HumanRequest.Status.ANSWERED, answer=clean, answered_by=by, answered_at=timezone.now()
    ):
        raise errors.AlreadyAnswered(f"{human_request_id} was already answered.")
    human_request.refresh_from_db()
    push_steering(
        recipient=human_request.asker, kind=SteeringItem.Kind.HUMAN_RESPONSE, sender=human_request.addressee.handle,
        human_request=human_request, payload=clean,
    )  # fmt: skip
    record(
        saga_id=human_request.saga_id,
        type="human_request.answered",
        actor=human_request.addressee.handle,
        data={"human_request_id": human_request.pk, "answer": clean},
    )
    return human_request


def visible_human_request(human_request: HumanRequest, user: User) -> bool:
    return user.pk in (human_request.addressee.user_id, human_request.asker.user_id) or may_manage(
        user, human_request.saga
    )


# --- the reconciler ----------------------------------------------------------------------------


def due_wait_ids(now: Any) -> Iterable[str]:
    return AgentRequest.objects.filter(wait_deadline__lte=now).values_list("pk", flat=True)[:500]


def due_expiry_ids(now: Any) -> Iterable[str]:
    return AgentRequest.objects.filter(status__in=AgentRequest.OPEN, expires_at__lte=now).values_list("pk", flat=True)[
        :500
    ]


# --- turns of internal runs (the runtime drives these; the kernel owns the state machine) -------


def lease_deadline() -> Any:
    return timezone.now() + timedelta(seconds=settings.AGORA_LEASE_S)


def queued_run(run_id: str) -> Run | None:
    """The run, with what a turn needs of it (its collaborator, saga and user), if it is queued."""
    row = fetch_one(_QUEUED_RUN_SQL, [run_id, Run.Status.QUEUED.value], Run, Collaborator, Saga, User)
    if row is None:
        return None
    run, collaborator, collaborator.saga, collaborator.user = row
    run.collaborator = collaborator
    return run


_QUEUED_RUN_SQL = (
    f"SELECT {columns(Run, 'r')}, {columns(Collaborator, 'c')}, {columns(Saga, 's')}, {columns(User, 'u')} "
    f"FROM {Run._meta.db_table} r JOIN {Collaborator._meta.db_table} c ON c.id = r.collaborator_id "
    f"JOIN {Saga._meta.db_table} s ON s.id = c.saga_id JOIN {User._meta.db_table} u ON u.id = c.user_id "
    "WHERE r.id = %s AND r.status = %s"
)


def take_turn(run: Run) -> bool:
    """In the caller's saga transaction: compare-and-set the queued run, as loaded, to running with
    the next turn number and a fresh lease; the object follows. False: a redelivered doorbell, or
    another worker got it (which rang its own doorbell for anything after)."""
    lease_until, now = lease_deadline(), timezone.now()
    queued = {"id": run.pk, "status": Run.Status.QUEUED, "turn": run.turn}
    if not update(Run, queued, status=Run.Status.RUNNING, turn=run.turn + 1, lease_until=lease_until, updated_at=now):
        return False
    run.status, run.turn, run.lease_until, run.updated_at = Run.Status.RUNNING, run.turn + 1, lease_until, now
    return True


def claim_turn(*, run_id: str) -> Run | None:
    """take_turn() in a transaction of its own; None when the run was not claimed."""
    run = queued_run(run_id)
    if run is None:
        return None
    with saga_transaction(run.collaborator.saga):
        return run if take_turn(run) else None


@transaction.atomic
def reclaim_lapsed_turn(*, run_id: str, now: Any, mark: Any) -> bool:
    """A turn whose lease lapsed (its worker died) is queued again, as last touched at `mark`."""
    saga_id = Run.objects.filter(pk=run_id).values_list("collaborator__saga_id", flat=True).first()
    if saga_id is None:
        return False
    lock_saga(saga_id)
    run = Run.objects.select_related("collaborator").get(pk=run_id)
    if not Run.objects.filter(pk=run_id, status=Run.Status.RUNNING, turn=run.turn, lease_until__lt=now).update(
        status=Run.Status.QUEUED, lease_until=None, updated_at=mark
    ):
        return False
    record(
        saga_id=run.collaborator.saga_id,
        type="run.reclaimed",
        actor=run.collaborator.handle,
        run_id=run_id,
        data={"turn": run.turn, "lease_until": run.lease_until.isoformat() if run.lease_until else None},
    )
    return True


def renew_lease(*, run_id: str, turn: int, next_turn: bool = False) -> bool:
    """Extend the lease of the running turn `turn`, or with `next_turn` move on to turn + 1 under
    a fresh lease. False once the turn has been taken away from this worker. A plain statement:
    every transaction of a turn starts with it."""
    mine = {"id": run_id, "status": Run.Status.RUNNING, "turn": turn}
    return bool(update(Run, mine, turn=turn + next_turn, lease_until=lease_deadline(), updated_at=timezone.now()))


@transaction.atomic(savepoint=False)
def park_on_request(*, run: Run, turn: int, request_id: str, tool_call_id: str) -> None:
    """Remember, with the request's creation, which tool call waits on it; the turn parks at its
    end. The caller's run object learns it too: end_turn() reads it from there."""
    Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING, turn=turn).update(
        waiting_on_id=request_id, wait_tool_call_id=tool_call_id
    )
    run.waiting_on_id, run.wait_tool_call_id = request_id, tool_call_id


@transaction.atomic(savepoint=False)
def end_turn(*, run: Run, turn: int, more: bool, carry_on: bool = False) -> str | None:
    """Leave the turn: wait on a request, come back for another turn, or go idle. With `carry_on`,
    a run that comes back keeps its worker: it stays `running` with the next turn number and a new
    lease (returns `running`) instead of queueing for any worker. `run` is the turn's own object,
    loaded with its collaborator and carrying what park_on_request() set.

    Under the saga lock, so a reply or a steering item that lands at the same instant either sees
    the run parked (and wakes it) or is seen here (and the run comes straight back).
    """
    collaborator = run.collaborator
    lock_saga(collaborator.saga_id)
    mine = {"id": run.pk, "status": Run.Status.RUNNING, "turn": turn}
    if run.waiting_on_id:
        request = AgentRequest.objects.get(pk=run.waiting_on_id)
        if request.is_open and request.wait_deadline is not None:
            if update(Run, mine, status=Run.Status.WAITING, wait_until=request.wait_deadline, lease_until=None):
                record_rest(run, Run.Status.WAITING, turn=turn, request_id=request.pk)
            return Run.Status.WAITING
        more = True  # answered (or timed out) before the turn even ended
    status = Run.Status.QUEUED if more or has_unread(collaborator) else Run.Status.IDLE
    if status == Run.Status.QUEUED and carry_on:
        return Run.Status.RUNNING if renew_lease(run_id=run.pk, turn=turn, next_turn=True) else None
    moved = update(Run, mine, status=status, lease_until=None, updated_at=timezone.now())
    if moved and status == Run.Status.QUEUED:
        ring_run_after_commit(run.pk)
    elif moved:
        record_rest(run, status, turn=turn)
    return status


def has_unread(collaborator: Collaborator) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_ANY_UNREAD_SQL, [collaborator.pk])
        return cursor.fetchone() is not None


_ANY_UNREAD_SQL = f"SELECT 1 FROM {SteeringItem._meta.db_table} WHERE recipient_id = %s AND consumed_at IS NULL LIMIT 1"


def record_rest(run: Run, status: str, *, turn: int, request_id: str = "") -> None:
    """Journal a run coming to rest (idle, or waiting on a request): the dashboard's roster and
    tree learn of it from the journal. A run going straight on to its next turn is not recorded;
    its next model call is."""
    data: dict[str, Any] = {"turn": turn}
    if request_id:
        data["request_id"] = request_id
    collaborator = run.collaborator
    record(saga_id=collaborator.saga_id, type=f"run.{status}", actor=collaborator.handle, run_id=run.pk, data=data)
