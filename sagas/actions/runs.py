"""Runs and leases: the state machine of an agent's run, the turns the runtime drives through it
(claim, lease, park, end), and its terminal transition."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from accounts.models import User
from config.sql import (
    columns,
    db,
    db_value,
    defer,
    failed_with,
    fetch,
    fetch_one,
    found_later,
    guarded,
    literals,
    placeholders,
    prepared,
    rows_later,
    update,
)
from journal.actions import ALWAYS, Condition, record
from sagas import errors
from sagas.actions.human_forms import cancel_forms
from sagas.actions.locking import holding, lock_open_saga, lock_saga
from sagas.actions.requests import Status, close_request, settle
from sagas.actions.steering import read_ahead, unread_ahead
from sagas.models import (
    AgentRequest,
    Collaborator,
    Delegation,
    HumanRequest,
    RemoteCall,
    Run,
    Saga,
    SteeringItem,
    Team,
)
from sagas.wakeups import ring_run, ring_run_after_commit


@transaction.atomic
def finish_run(
    *, run: Run, status: str, result: Any = None, error: str = "", actor: str | None = None, worker: str = ""
) -> bool:
    """A run's terminal transition. Every open request addressed to it becomes
    `recipient_unavailable` in the same transaction, and each sender is told; the forms its agent
    asked that wait for an answer are withdrawn (no answer would reach it); a team's lead takes its
    teammates at work down with it (shut down, as its own shutdown of each would). `worker`: the
    node name of the worker whose turn ended the run, if one did."""
    collaborator = run.collaborator
    lock_saga(collaborator.saga_id)
    if status not in Run.FINISHED:
        raise errors.InvalidPayload(f"{status} is not a terminal run status.")
    # Plain statements (config.sql): every prompt's worker ends here. The compare-and-set goes with
    # the read of the requests it strands (one message on PostgreSQL), which is read for nothing if
    # another ending came first.
    finished = rows_later(
        _FINISH_SQL,
        [status, db_value(Run, "result", result), error, run.pk, *_UNFINISHED, collaborator.pk, collaborator.pk],
    )
    stranded = fetch(_STRANDED_SQL, [collaborator.pk], AgentRequest, Collaborator, Collaborator)
    ended = finished()
    if not ended:
        return False
    data = {"result": result, "error": error}
    if worker:
        data["worker"] = worker
    update(Delegation, {"delegate": collaborator.pk}, later=True, status=DELEGATION_STATUS.get(status, "cancelled"))
    defer(_END_WAITS_SQL, [collaborator.pk])
    why = f"{collaborator.handle} ended ({status}) before replying."
    gone = {"code": Status.RECIPIENT_UNAVAILABLE.value, "message": why}
    for request, request.sender, request.recipient in stranded:
        if settle(request, Status.RECIPIENT_UNAVAILABLE, error=gone):
            close_request(request, actor=collaborator.handle, notify_recipient=False)
    ((_, asking, leading),) = ended
    if asking:  # rare: most runs end with no form open, and learn it with the compare-and-set
        cancel_forms(HumanRequest.objects.filter(asker=collaborator), actor=actor or collaborator.handle)
    record(
        saga_id=collaborator.saga_id,
        type=f"run.{status}",
        actor=actor or collaborator.handle,
        run_id=run.pk,
        data=data,
    )
    if leading:  # rare too: a team's lead, learnt with the compare-and-set (others pay nothing for it)
        from sagas.actions.teams import shutdown_team  # which imports this module (end_run)

        lead_gone = f"The team's lead {collaborator.handle} ended ({status})."
        shutdown_team(team=collaborator.team, reason=lead_gone, actor=actor or collaborator.handle)
    return True


def end_run(*, run: Run, status: str, reason: str, actor: str) -> bool:
    """finish_run() for a run ended from outside it (a teammate shut down, a prompt cancelled), in
    the caller's transaction under the saga lock; then what its agent was still waiting for: the
    requests it sent are cancelled (finish_run() withdrew its forms)."""
    if not finish_run(run=run, status=status, error=reason, actor=actor):
        return False
    agent = run.collaborator
    for request in AgentRequest.objects.filter(sender=agent, status__in=AgentRequest.OPEN).select_related(
        "sender", "recipient"
    ):
        if settle(request, Status.CANCELLED):
            close_request(request, actor=agent.handle, notify_recipient=True)
    return True


_UNFINISHED = [status for status in Run.Status.values if status not in Run.FINISHED]
_OPEN_REQUESTS = [status.value for status in AgentRequest.OPEN]
_FINISH_SQL = prepared(
    f"UPDATE {Run._meta.db_table} SET status = %s, result = %s, error = %s, lease_until = NULL, "
    "waiting_on_id = NULL, waiting_on_remote_id = NULL, wait_until = NULL "
    f"WHERE id = %s AND status IN ({placeholders(len(_UNFINISHED))}) "
    # whether its agent asked forms still waiting for an answer (finish_run() withdraws them)
    f"RETURNING id, EXISTS (SELECT 1 FROM {HumanRequest._meta.db_table} h "
    f"WHERE h.asker_id = %s AND h.status IN ({literals([HumanRequest.Status.PENDING.value])})), "
    # whether it leads a team with teammates at work (finish_run() shuts them down)
    f"EXISTS (SELECT 1 FROM {Team._meta.db_table} t JOIN {Run._meta.db_table} m ON m.team_id = t.id "
    f"WHERE t.lead_id = %s AND m.status IN ({literals(_UNFINISHED)}))"
)
# A finished run waits on nothing: its requests' wait edges end (the waits-for graph, check_no_cycle).
_END_WAITS_SQL = (
    f"UPDATE {AgentRequest._meta.db_table} SET wait_deadline = NULL WHERE sender_id = %s AND wait_deadline IS NOT NULL"
)
# The open requests addressed to it, with their sender and recipient (close_request() reads both);
# the statuses written out, so that its index finds them among its open ones.
_STRANDED_SQL = (
    f"SELECT {columns(AgentRequest, 'q')}, {columns(Collaborator, 's')}, {columns(Collaborator, 'r')} "
    f"FROM {AgentRequest._meta.db_table} q JOIN {Collaborator._meta.db_table} s ON s.id = q.sender_id "
    f"JOIN {Collaborator._meta.db_table} r ON r.id = q.recipient_id "
    f"WHERE q.recipient_id = %s AND q.status IN ({literals(_OPEN_REQUESTS)}) ORDER BY q.created_at"
)

REMOTE_WAIT_GRACE_S = 2.0

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
        lock_open_saga(run.collaborator.saga_id)
        if run.is_finished and not run.resumable:
            raise errors.InvalidState(f"{run_id} has {run.status}.")
        if Run.objects.filter(pk=run.pk).exclude(status=target).update(status=target):
            record(saga_id=run.collaborator.saga_id, type=f"run.{target}", actor=run.collaborator.handle, run_id=run.pk)
    run.refresh_from_db()
    return run


def lease_deadline() -> Any:
    return timezone.now() + timedelta(seconds=settings.AGORA_LEASE_S)


def claimed_run_sql(*, also: str = "", join: str = "") -> str:
    """The read of a run (`r`) with its collaborator (`c`), saga and user, for claimed_run(). The
    runtime adds what it needs of its own for the run's next task (`also`: more columns, from
    tables it `join`s), in the same statement."""
    return (
        f"SELECT {columns(Run, 'r')}, {columns(Collaborator, 'c')}, {columns(Saga, 's')}, {columns(User, 'u')}"
        + (f", {also} " if also else " ")
        + f"FROM {Run._meta.db_table} r JOIN {Collaborator._meta.db_table} c ON c.id = r.collaborator_id "
        f"JOIN {Saga._meta.db_table} s ON s.id = c.saga_id JOIN {User._meta.db_table} u ON u.id = c.user_id "
        + (f"{join} " if join else "")
        + "WHERE r.id = %s"
    )


class Claimed(NamedTuple):
    """A claimed run, as claimed_run() read it with its claim."""

    run: Run  # with its collaborator, saga and user
    also: list[Any]  # an instance of each model of `also` (None where an outer join found none), then
    # the values of the columns after theirs, as read
    ahead: Any  # what the caller's `ahead` returned


@contextmanager
def claimed_run(
    sql: str,
    run_id: str,
    *also: type[models.Model],
    worker: str = "",
    ahead: Callable[[], Any] = lambda: None,
    look_first: bool = False,
) -> Iterator[Claimed | None]:
    """Claim a queued run's next turn, in a transaction under its saga's lock that lasts as long as
    the caller's block (the actions run in it find the lock held, and the saga's copy current, as
    in saga_transaction(current=True)): the run becomes `running` with the next turn number and a
    fresh lease, held by `worker` (a Celery node name). One message on PostgreSQL: the saga's
    lock, found from the run; the compare-and-set; the read of the claimed run (a
    claimed_run_sql() statement); its unread steering, which the turn's input takes
    (unread_ahead()); what the caller reads ahead of the claim's answer with config.sql's deferred
    reads (`ahead`, called before the run is read). None, and nothing written: a redelivered
    doorbell, or another worker holds the run (and rang its own doorbell for anything after).

    With `look_first`, and always on SQLite, whether the run is queued is read first, without the
    saga's lock (and outside any transaction): a task that rang the run and is free now does not
    queue behind the lock of a worker that has it already, and on SQLite a doorbell that comes after
    its run was taken does not take the one write lock for nothing. The claim decides; the look only
    spares a useless one."""
    look = (look_first or db().vendor == "sqlite") and not db().in_atomic_block
    if look and fetch_one(_QUEUED_SQL, [run_id, Run.Status.QUEUED.value]) is None:
        yield None
        return
    params = [
        Run.Status.RUNNING.value, db_value(Run, "lease_until", lease_deadline()),
        db_value(Run, "updated_at", timezone.now()), worker, run_id, Run.Status.QUEUED.value,
    ]  # fmt: skip
    with transaction.atomic():
        if db().vendor != "sqlite":  # where BEGIN IMMEDIATE has taken the one write lock already
            defer(_LOCK_RUNS_SAGA_SQL, [run_id])
        claimed = found_later(_CLAIM_SQL, params)
        unread, before = read_ahead(run_id), ahead()
        row = fetch_one(sql, [run_id], Run, Collaborator, Saga, User, *also)
        if row is None or not claimed():
            transaction.set_rollback(True)  # the lock, taken for nothing
            yield None
            return
        run, collaborator, collaborator.saga, collaborator.user, *more = row
        run.collaborator = collaborator
        with holding(collaborator.saga, current=True), unread_ahead(collaborator.pk, unread):
            yield Claimed(run, more, before)


_LOCK_RUNS_SAGA_SQL = prepared(
    f"SELECT s.status FROM {Saga._meta.db_table} s WHERE s.id = (SELECT c.saga_id FROM {Run._meta.db_table} r "
    f"JOIN {Collaborator._meta.db_table} c ON c.id = r.collaborator_id WHERE r.id = %s) FOR NO KEY UPDATE"
)
_CLAIM_SQL = prepared(
    f"UPDATE {Run._meta.db_table} SET status = %s, turn = turn + 1, lease_until = %s, updated_at = %s, worker = %s "
    "WHERE id = %s AND status = %s RETURNING id"
)
_CLAIMED_RUN_SQL = claimed_run_sql()


_QUEUED_SQL = prepared(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s AND status = %s")


def claim_turn(*, run_id: str, worker: str = "") -> Run | None:
    """claimed_run() in a transaction of its own: the claimed run, or None."""
    with claimed_run(_CLAIMED_RUN_SQL, run_id, worker=worker) as claimed:
        return None if claimed is None else claimed.run


@transaction.atomic
def reclaim_lapsed_turn(*, run_id: str, now: Any, mark: Any) -> bool:
    """A turn whose lease lapsed (its worker died) is queued again, as last touched at `mark`. The
    journal names the worker that lost it. The next turn makes it again: the run's budget of turns
    does not count it (`reclaims`). Reclaims of turns one after another (`reclaims_in_row`) are a
    turn that fails each time it is made: past AGORA_MAX_RECLAIMS the run's next turn fails it."""
    saga_id = Run.objects.filter(pk=run_id).values_list("collaborator__saga_id", flat=True).first()
    if saga_id is None:
        return False
    lock_saga(saga_id)
    run = Run.objects.select_related("collaborator").get(pk=run_id)
    if not Run.objects.filter(pk=run_id, status=Run.Status.RUNNING, turn=run.turn, lease_until__lt=now).update(
        status=Run.Status.QUEUED,
        lease_until=None,
        updated_at=mark,
        reclaims=models.F("reclaims") + 1,
        reclaimed_turn=models.F("turn"),
        reclaims_in_row=models.Case(  # the turn before was taken back too: its remake is this one
            models.When(reclaimed_turn=models.F("turn") - 1, then=models.F("reclaims_in_row") + 1), default=1
        ),
    ):
        return False
    record(
        saga_id=run.collaborator.saga_id,
        type="run.reclaimed",
        actor=run.collaborator.handle,
        run_id=run_id,
        data={
            "turn": run.turn,
            "lease_until": run.lease_until.isoformat() if run.lease_until else None,
            "lost_by": run.worker,
        },
    )
    return True


def renew_lease(*, run_id: str, turn: int, next_turn: bool = False, later: bool = False) -> bool:
    """Extend the lease of the running turn `turn`, or with `next_turn` move on to turn + 1 under
    a fresh lease. False once the turn has been taken away from this worker. With `later`, for the
    transaction that has proved the lease already (its row is locked until the commit, so the
    renewal cannot miss), nothing waits for it."""
    held = found_later(_RENEW_SQL, renewal(run_id, turn, next_turn))
    return later or held()


def prove_lease(*, run_id: str, turn: int) -> Callable[[], bool]:
    """renew_lease() for a transaction of the turn that goes on without waiting for its answer:
    the renewal goes with the transaction's next statement (config.sql.defer), and takes the run's
    row lock first, so a turn found this worker's stays so to the commit. The answer, called before
    the commit, says whether it was; on False the caller rolls back everything the transaction did
    since. On PostgreSQL it is always True: the server fails the transaction itself when the renewal
    finds no row (agora_turn_held(), sagas/migrations/0009), with an error turn_lost() recognises,
    so that the transaction's COMMIT can go in the same message. Every transaction of a turn starts
    with it."""
    params = renewal(run_id, turn, False)
    if db().vendor == "sqlite":
        return found_later(_RENEW_SQL, params)
    defer(_RENEW_HELD_SQL, params)
    return lambda: True


def renewal(run_id: str, turn: int, next_turn: bool) -> list[Any]:
    return [
        turn + next_turn, db_value(Run, "lease_until", lease_deadline()), db_value(Run, "updated_at", timezone.now()),
        run_id, Run.Status.RUNNING.value, turn,
    ]  # fmt: skip


TURN_LOST = "AG001"  # the SQLSTATE of agora_turn_held()'s error


def turn_lost(exc: BaseException) -> bool:
    """Whether a database error is the server's word that a turn's lease renewal found no row."""
    return failed_with(exc, TURN_LOST)


_RENEW_SQL = prepared(
    f"UPDATE {Run._meta.db_table} SET turn = %s, lease_until = %s, updated_at = %s "
    "WHERE id = %s AND status = %s AND turn = %s RETURNING id"
)
_RENEW_HELD_SQL = prepared(guarded(_RENEW_SQL, "agora_turn_held"))


@transaction.atomic(savepoint=False)
def park_on_request(*, run: Run, turn: int, request_id: str, tool_call_id: str) -> None:
    """Remember, with the request's creation, which tool call waits on it; the turn parks at its
    end. The caller's run object learns it too: end_turn() reads it from there."""
    mine = {"id": run.pk, "status": Run.Status.RUNNING, "turn": turn}
    update(Run, mine, later=True, waiting_on=request_id, wait_tool_call_id=tool_call_id)  # nothing reads its count
    run.waiting_on_id, run.wait_tool_call_id = request_id, tool_call_id


def clear_wait(*, run: Run) -> None:
    """The parked wait is over (its result is in the turn's transcript): with the turn's
    transaction, nothing waits for it (config.sql.defer)."""
    update(Run, {"id": run.pk}, later=True, waiting_on=None, wait_tool_call_id="")
    run.waiting_on_id, run.wait_tool_call_id = None, ""


def end_turn(*, run: Run, turn: int, more: bool, carry_on: bool = False) -> str | None:
    """end_turn_later(), answered: the run's new status; None when the turn was not its own."""
    return end_turn_later(run=run, turn=turn, more=more, carry_on=carry_on)()


@transaction.atomic(savepoint=False)
def end_turn_later(*, run: Run, turn: int, more: bool, carry_on: bool = False) -> Callable[[], str | None]:
    """Leave the turn: wait on a request, come back for another turn, or go idle. With `carry_on`,
    a run that comes back keeps its worker: it stays `running` with the next turn number and a new
    lease (`running`) instead of queueing for any worker: only in the transaction that proved this
    task's lease (the turn's own, agents/turns.py), so moving on cannot miss. `run` is the
    turn's own object, loaded with its collaborator and carrying what park_on_request() set.

    Under the saga lock, so a reply or a steering item that lands at the same instant either sees
    the run parked (and wakes it) or is seen here (and the run comes straight back).

    The run's new status, to ask for: known at once, except for a turn that comes to rest with
    nothing more to do (`more` False, nothing to wait for), which nothing waits for (rest_later()).
    """
    collaborator = run.collaborator
    lock_saga(collaborator.saga_id)
    mine = {"id": run.pk, "status": Run.Status.RUNNING, "turn": turn}
    if run.waiting_on_id:
        request = AgentRequest.objects.get(pk=run.waiting_on_id)
        if request.is_open and request.wait_deadline is not None:
            if update(Run, mine, status=Run.Status.WAITING, wait_until=request.wait_deadline, lease_until=None):
                record_rest(run, Run.Status.WAITING, turn=turn, request_id=request.pk)
            return lambda: Run.Status.WAITING
        more = True  # answered (or timed out) before the turn even ended
    elif run.waiting_on_remote_id:
        call = RemoteCall.objects.get(pk=run.waiting_on_remote_id)
        if call.is_open:
            # A little past the call's own deadline: its follower normally ends it first, with
            # the remote task's id; if not, the resumed turn ends it (time_out_remote_call).
            until = call.deadline + timedelta(seconds=REMOTE_WAIT_GRACE_S)
            if update(Run, mine, status=Run.Status.WAITING, wait_until=until, lease_until=None):
                record_rest(run, Run.Status.WAITING, turn=turn, remote_call_id=call.pk)
            return lambda: Run.Status.WAITING
        more = True
    if more and carry_on:
        renew_lease(run_id=run.pk, turn=turn, next_turn=True, later=True)
        return lambda: Run.Status.RUNNING
    if more:
        if update(Run, mine, status=Run.Status.QUEUED, lease_until=None, updated_at=timezone.now()):
            ring_run_after_commit(run.pk)
        return lambda: Run.Status.QUEUED
    return rest_later(run, turn=turn, carry_on=carry_on)


def rest_later(run: Run, *, turn: int, carry_on: bool) -> Callable[[], str | None]:
    """The end of a turn with nothing more to do, in one statement: idle, unless steering is
    unread; then queued (rung after the commit), or with `carry_on` running the next turn under a
    fresh lease (as renew_lease(next_turn=True) would). Its `run.idle` event is written in the same
    message, on the condition that the run is then idle at this turn. Nothing waits for either: the
    run's new status comes with the transaction's next statement or its COMMIT (None when the turn
    was not its own)."""
    back = (Run.Status.RUNNING if carry_on else Run.Status.QUEUED).value
    lease = db_value(Run, "lease_until", lease_deadline())
    rows = rows_later(
        _REST_UNLESS_STEERED_SQL,
        [back, Run.Status.IDLE.value, carry_on, carry_on, lease, db_value(Run, "updated_at", timezone.now()),
         run.collaborator_id, run.pk, Run.Status.RUNNING.value, turn],
    )  # fmt: skip
    record_rest(run, Run.Status.IDLE, turn=turn, when=(_RESTED_IDLE, [run.pk, Run.Status.IDLE.value, turn]))

    def status() -> str | None:
        answer = rows()
        return Run.Status(answer[0][0]) if answer else None

    def ring() -> None:  # back in line: for any worker
        if status() == Run.Status.QUEUED:
            ring_run(run.pk)

    transaction.on_commit(ring)
    return status


# The steering is read in the statement, under the saga lock that end_turn() holds. The lease's
# NULL is the column's own (NULLIF of it with itself): PostgreSQL types the CASE from it, whatever
# the new lease is bound as.
_REST_UNLESS_STEERED_SQL = prepared(
    f"UPDATE {Run._meta.db_table} SET status = CASE WHEN x.unread THEN %s ELSE %s END, "
    "turn = CASE WHEN x.unread AND %s THEN turn + 1 ELSE turn END, "
    "lease_until = CASE WHEN x.unread AND %s THEN %s ELSE NULLIF(lease_until, lease_until) END, updated_at = %s "
    f"FROM (SELECT EXISTS (SELECT 1 FROM {SteeringItem._meta.db_table} WHERE recipient_id = %s "
    "AND consumed_at IS NULL) AS unread) x "
    "WHERE id = %s AND status = %s AND turn = %s RETURNING status"
)


_RESTED_IDLE = f"EXISTS (SELECT 1 FROM {Run._meta.db_table} WHERE id = %s AND status = %s AND turn = %s)"


def record_rest(
    run: Run, status: str, *, turn: int, request_id: str = "", remote_call_id: str = "", when: Condition = ALWAYS
) -> None:
    """Journal a run coming to rest (idle, or waiting on a request): the dashboard's roster and
    tree learn of it from the journal. A run going straight on to its next turn is not recorded;
    its next model call is. `when`: as record() takes it."""
    data: dict[str, Any] = {"turn": turn}
    if run.worker:
        data["worker"] = run.worker
    if request_id:
        data["request_id"] = request_id
    if remote_call_id:
        data["remote_call_id"] = remote_call_id
    collaborator = run.collaborator
    record(
        saga_id=collaborator.saga_id, type=f"run.{status}", actor=collaborator.handle, run_id=run.pk, data=data,
        when=when,
    )  # fmt: skip
