"""Steering: each collaborator's durable inbound queue, drained at turn boundaries."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from config.sql import (
    RowsLater,
    columns,
    db,
    defer,
    fetch,
    fetch_later,
    flush,
    placeholders,
    prepared,
    rows_later,
    update,
)
from journal.actions import record
from sagas import errors
from sagas.access import may_manage
from sagas.actions.collaborators import actor_id
from sagas.actions.locking import lock_open_saga, lock_saga, rings_early
from sagas.actions.payloads import body_hash, check_payload, first_for_key
from sagas.metrics import count_round_trips
from sagas.models import AgentRequest, Broadcast, Collaborator, HumanRequest, Run, Saga, SteeringItem
from sagas.wakeups import publish_after_commit, ring_run, steering_channel

Unread = Callable[[], list[list[Any]]]  # a recipient's unread steering, read ahead: read_ahead()
# The recipient whose unread steering the current transaction has read ahead, and what it read.
_ahead: ContextVar[tuple[Any, Unread] | None] = ContextVar("unread_ahead", default=None)

# Every request and reply goes through push_steering(): plain statements. The first takes the
# recipient's next seq; nothing waits for its answer, the insert reads it back (on PostgreSQL both go
# in one message: config.sql.defer).
_NEXT_STEERING_SEQ_SQL = f"UPDATE {Collaborator._meta.db_table} SET steering_seq = steering_seq + 1 WHERE id = %s"
_PUSHED = ("kind", "sender", "request", "human_request", "broadcast", "payload", "created_at")
_PUSH_SQL = prepared(
    f"INSERT INTO {SteeringItem._meta.db_table} (recipient_id, seq, "
    + ", ".join(SteeringItem._meta.get_field(name).column for name in _PUSHED)  # type: ignore[union-attr, misc]
    + f") SELECT id, steering_seq, {placeholders(len(_PUSHED))} FROM {Collaborator._meta.db_table} "
    "WHERE id = %s RETURNING id, seq"
)
_WAKE_SQL = prepared(
    f"UPDATE {Run._meta.db_table} SET status = %s WHERE collaborator_id = %s AND status = %s RETURNING id"
)


def push_steering(
    *,
    recipient: Collaborator,
    kind: str,
    sender: str,
    request: AgentRequest | None = None,
    human_request: HumanRequest | None = None,
    broadcast: Broadcast | None = None,
    payload: Any = None,
    later: bool = False,
) -> SteeringItem:
    """Append to the recipient's steering and wake it after commit; never interrupts a running turn.

    With `later` nothing here waits for the database (config.sql.defer): the item's id and seq
    arrive with the transaction's next statement or its COMMIT, for a caller that does not read them."""
    item = SteeringItem(
        recipient=recipient, kind=kind, sender=sender, request=request, human_request=human_request,
        broadcast=broadcast, payload=payload,
    )  # fmt: skip
    conn = db()
    fields = [SteeringItem._meta.get_field(name) for name in _PUSHED]
    params = [f.get_db_prep_save(f.pre_save(item, True), conn) for f in fields]  # type: ignore[union-attr]
    steering_written(recipient.pk)
    defer(_NEXT_STEERING_SEQ_SQL, [recipient.pk])

    def pushed(rows: list[tuple[Any, ...]]) -> None:
        item.pk, item.seq = rows[0]

    defer(_PUSH_SQL, [*params, recipient.pk], then=pushed)
    if not later:
        flush()
    item._state.adding, item._state.db = False, conn.alias
    wake(recipient)
    return item


def waits_over_http(collaborator: Collaborator) -> bool:
    """Whether collaborator may be waiting on Agora over HTTP (a steering long-poll, an ask in
    `wait` mode), which a ping after commit wakes. An internal agent never is: Celery rings its
    turns, and a ping for nobody costs the committing turn about a millisecond."""
    return collaborator.runtime != Collaborator.Runtime.INTERNAL


def wake(collaborator: Collaborator) -> None:
    """An idle internal run gets a turn; a running one finds the item when its turn ends; anyone
    else may be long-polling its steering. Nothing waits for the database: the run to ring, if
    any, comes back before the commit it is rung after."""
    if waits_over_http(collaborator):
        publish_after_commit(steering_channel(collaborator.pk))
        return
    woken = rows_later(_WAKE_SQL, [Run.Status.QUEUED.value, collaborator.pk, Run.Status.IDLE.value])
    ring_woken(woken, rung=ring_before_commit(collaborator))


def ring_woken(woken: RowsLater, *, rung: str | None) -> None:
    """After the commit, ring the runs a deferred `UPDATE … RETURNING id` woke (`woken`), but the
    one rung before it."""

    def ring() -> None:
        for (run_id,) in woken():
            if run_id != rung:
                ring_run(run_id)

    transaction.on_commit(ring)


def ring_before_commit(collaborator: Collaborator, *, parked_on: Any = None) -> str | None:
    """Ring the collaborator's idle run (or, with `parked_on`, its run parked on that request) now
    rather than after commit where that is safe (locking.rings_early()): the Celery hop then
    overlaps the rest of this transaction and its COMMIT. Only for a collaborator that came with
    its run, as read under the saga's lock (by an ask, or by a reply in a turn): an older copy
    costs at most a doorbell that finds the run taken. Returns the id of the run it rang."""
    if not Collaborator.run.is_cached(collaborator):
        return None
    run = collaborator.run
    if parked_on is None:
        ready = run.status == Run.Status.IDLE
    else:
        ready = run.status == Run.Status.WAITING and str(run.waiting_on_id) == str(parked_on)
    if not ready or not rings_early(collaborator.saga_id):
        return None
    ring_run(run.pk)
    return str(run.pk)


def resume_waiter(request: AgentRequest) -> None:
    """A run parked on this request gets its next turn, which reads the outcome. As in wake(),
    nothing waits for the database: the run to ring comes back before the commit it is rung
    after, or was rung before it."""
    woken = rows_later(_RESUME_SQL, [Run.Status.QUEUED.value, request.pk, Run.Status.WAITING.value])
    ring_woken(woken, rung=ring_before_commit(request.sender, parked_on=request.pk))


_RESUME_SQL = prepared(
    f"UPDATE {Run._meta.db_table} SET status = %s, wait_until = NULL WHERE waiting_on_id = %s AND status = %s "
    "RETURNING id"
)


def check_backlog(recipient: Collaborator) -> None:
    backlog = SteeringItem.objects.filter(recipient=recipient, consumed_at__isnull=True).count()
    if backlog >= settings.AGORA_MAX_STEERING_BACKLOG:
        raise errors.TooManyPending(f"{recipient.handle} has {backlog} unread steering items.")


def acknowledge_steering(*, recipient: Collaborator, upto_seq: int) -> None:
    """An external agent's cursor (`after`, REST and MCP): its unread items up to it are read.
    A cursor past its newest item is refused: none was handed out (each is an item's seq, or 0),
    and it would acknowledge items never read and hide those that come until their seq passes it."""
    items = SteeringItem.objects.filter(recipient=recipient)
    if upto_seq > 0 and not items.filter(seq__gte=upto_seq).exists():
        raise errors.InvalidPayload(
            "Bad cursor: past your newest item.", errors={"after": ["The seq of an item you read, or 0."]}
        )
    if items.filter(seq__lte=upto_seq, consumed_at__isnull=True).exists():
        consume_steering(recipient=recipient, upto_seq=upto_seq)


# The turn's own steps (consume_steering, park_on_request, end_turn) join the caller's transaction
# without a savepoint: a failure in one of them fails the turn whole.
@transaction.atomic(savepoint=False)
def consume_steering(
    *, recipient: Collaborator, upto_seq: int | None = None, turn: int | None = None
) -> list[SteeringItem]:
    """Mark the recipient's unread items (up to `upto_seq`) consumed, by `turn` for internal runs.

    Called in the transaction that records the turn's input, so a crash before it leaves them
    unread. Requests among them become `delivered`. The items read ahead for the recipient
    (unread_ahead()) serve in place of a read of its own.
    """
    lock_saga(recipient.saga_id)
    ahead = _ahead.get()
    if upto_seq is None and ahead is not None and ahead[0] == recipient.pk:
        _ahead.set(None)  # consumed now: a second call reads what came since
        rows = ahead[1]()
    else:
        upto, params = ("", [recipient.pk]) if upto_seq is None else (" AND i.seq <= %s", [recipient.pk, upto_seq])
        rows = fetch(_UNREAD_SQL.format(upto=upto), params, SteeringItem, AgentRequest)
    if not rows:
        return []
    for item, request in rows:
        item.request = request
    consumed: list[SteeringItem] = [item for item, _ in rows]
    now = timezone.now()
    update(SteeringItem, {"id": [i.pk for i in consumed]}, later=True, consumed_at=now, consumed_turn=turn)
    for item in consumed:
        item.consumed_at, item.consumed_turn = now, turn
    count_round_trips(consumed, at=now)
    # Read under the saga's lock, which every writer of requests takes: their status as read decides
    # which of them this delivers, and nothing waits for the compare-and-set.
    pending = AgentRequest.Status.PENDING
    requests = [i.request for i in consumed if i.kind == SteeringItem.Kind.REQUEST]
    delivered = [r for r in requests if r is not None and r.status == pending]  # in steering order
    if delivered:
        update(AgentRequest, {"id": [r.pk for r in delivered], "status": pending}, later=True,
               status=AgentRequest.Status.DELIVERED)  # fmt: skip
    for request in delivered:
        request.status = AgentRequest.Status.DELIVERED
        record(saga_id=recipient.saga_id, type="request.delivered", actor=recipient.handle,
               data={"request_id": request.pk})  # fmt: skip
    return consumed


_UNREAD_FROM = (
    f"SELECT {columns(SteeringItem, 'i')}, {columns(AgentRequest, 'q')} FROM {SteeringItem._meta.db_table} i "
    f"LEFT JOIN {AgentRequest._meta.db_table} q ON q.id = i.request_id "
)
_UNREAD_SQL = _UNREAD_FROM + "WHERE i.recipient_id = %s AND i.consumed_at IS NULL{upto} ORDER BY i.seq"


def consume_reply(*, recipient: Collaborator, request: AgentRequest, turn: int) -> None:
    """The reply to a request its sender waited on, given to it as its tool call's result: the
    reply's steering item is consumed with it, by `turn`, and not rendered again."""
    steering_written(recipient.pk)
    SteeringItem.objects.filter(recipient=recipient, request=request, consumed_at__isnull=True).update(
        consumed_turn=turn, consumed_at=request.updated_at
    )


def consume_reply_ahead(*, recipient: Collaborator, request_id: Any, turn: int) -> tuple[AgentRequest, str] | None:
    """consume_reply() from the steering read ahead for the recipient (unread_ahead()), with
    nothing waiting for the database: the closed request and who answered it (its items' sender);
    consume_steering() then takes the rest of what was read ahead. None when that holds no item
    about the request (nothing was read ahead, or the request is still open): the caller reads it."""
    ahead = _ahead.get()
    if ahead is None or ahead[0] != recipient.pk:
        return None
    rows = ahead[1]()
    mine = [row for row in rows if row[1] is not None and str(row[1].pk) == str(request_id) and not row[1].is_open]
    if not mine:
        return None
    rest = [row for row in rows if all(row is not taken for taken in mine)]
    _ahead.set((recipient.pk, lambda: rest))
    item, request = mine[0]
    ids = [i.pk for i, _ in mine]
    update(SteeringItem, {"id": ids}, later=True, consumed_turn=turn, consumed_at=request.updated_at)
    return request, item.sender


def read_ahead(run_id: str) -> Unread | None:
    """The unread steering of a run's collaborator, read with the transaction's next statement
    (config.sql.defer), for unread_ahead(): at the start of a transaction of its turn, where the
    read then costs no round trip of its own. None on SQLite, where no statement does."""
    if db().vendor == "sqlite":
        return None
    return fetch_later(_UNREAD_OF_RUN_SQL, [run_id], SteeringItem, AgentRequest)


@contextmanager
def unread_ahead(recipient_id: Any, unread: Unread | None) -> Iterator[None]:
    """Inside the block, consume_steering() takes `unread` (read_ahead(), under the saga's lock
    that the transaction holds) for the recipient in place of a read of its own, unless the
    recipient's steering was written since (push_steering(), consume_reply())."""
    token = _ahead.set(None if unread is None else (recipient_id, unread))
    try:
        yield
    finally:
        _ahead.reset(token)


def steering_written(recipient_id: Any) -> None:
    """What was read ahead for the recipient no longer is its steering."""
    ahead = _ahead.get()
    if ahead is not None and ahead[0] == recipient_id:
        _ahead.set(None)


_UNREAD_OF_RUN_SQL = prepared(
    f"{_UNREAD_FROM}WHERE i.recipient_id = (SELECT collaborator_id FROM {Run._meta.db_table} WHERE id = %s) "
    "AND i.consumed_at IS NULL ORDER BY i.seq"
)


@transaction.atomic
def steer(
    *, saga: Saga, to: Collaborator, message: Any, by: User, idempotency_key: str = ""
) -> tuple[SteeringItem, bool]:
    """A manager's message to an agent, delivered at its next turn boundary. Returns the item and
    whether it is new: a retry with the same Idempotency-Key and message returns the first item
    (under the saga's lock, so two retries at once find each other), with another message it is
    `idempotency_conflict`."""
    saga = lock_open_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga steer its agents.")
    if to.saga_id != saga.pk:  # managing one saga gives no reach into another
        raise errors.NotFound(f"No collaborator {to.handle} in this saga.")
    if not to.is_agent:
        raise errors.InvalidPayload("Steer agents; ask people through forms.", errors={"to": ["Not an agent."]})
    check_payload(message, field="message")
    sender, digest = actor_id(saga, by), body_hash(message=message)
    if idempotency_key and (
        first := first_for_key(
            SteeringItem.objects.filter(recipient=to, sender=sender, idempotency_key=idempotency_key), digest,
            conflict="This Idempotency-Key was already used for another message.",
        )
    ):  # fmt: skip
        return first, False
    check_backlog(to)
    item = push_steering(recipient=to, kind=SteeringItem.Kind.MESSAGE, sender=sender, payload=message)
    if idempotency_key:
        SteeringItem.objects.filter(pk=item.pk).update(idempotency_key=idempotency_key, body_hash=digest)
    record(saga_id=saga.pk, type="steering.message", actor=sender, data={"to": to.handle, "seq": item.seq})
    return item, True
