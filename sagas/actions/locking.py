"""The saga lock every write takes first, and the transaction a turn holds it in.

Every action starts by locking the saga row: all of a saga's writes already queue on its journal
head, so taking that place in line first costs nothing and rules out lock-order deadlocks.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

from django.db import connection, transaction

from config.sql import RowsLater, db_value, rows_later
from sagas import errors
from sagas.models import Saga


class HeldLock(NamedTuple):
    saga: Saga
    current: bool  # the copy's status is known to be the row's (see saga_transaction)
    # The lock's statement, deferred (its rows: the row's status); None: granted, nothing read.
    lock: RowsLater | None = None


# The saga whose row lock the current transaction holds, set by saga_transaction(): the actions
# called inside it find the lock taken and do not ask for it again.
_held_lock: ContextVar[HeldLock | None] = ContextVar("held_saga_lock", default=None)


def lock_saga(saga_id: Any) -> Saga:
    if (held := held_saga(saga_id)) is not None:
        return held
    # NO KEY UPDATE: writers of one saga queue here, but inserts that merely reference the saga
    # (journal events, requests) take KEY SHARE on it and must not wait behind us, or a writer
    # holding a journal head while inserting its event deadlocks with us.
    saga = Saga.objects.select_for_update(no_key=True).filter(pk=saga_id).first()
    if saga is None:
        raise errors.NotFound(f"No saga {saga_id}.")
    return saga


def held_saga(saga_id: Any) -> Saga | None:
    """The saga's copy, if this transaction already holds its lock (saga_transaction): what it
    reads of the saga's state now stays as read until it commits."""
    held = _held_lock.get()
    return held.saga if held is not None and str(held.saga.pk) == str(saga_id) else None


def rings_early(saga_id: Any) -> bool:
    """Whether a doorbell for a run of this saga may go now rather than after this transaction's
    commit: on PostgreSQL, when this transaction holds the saga's lock and the server has granted
    it already. The claim the doorbell brings asks for that lock first (found from its run), so it
    waits for this transaction to end; each of the claim's later statements then reads what was
    committed, and finds nothing to claim if it rolled back. (On SQLite a claim waiting for the
    write lock sleeps between tries: there the doorbell waits for the commit.)"""
    held = _held_lock.get()
    if connection.vendor == "sqlite" or held is None or held_saga(saga_id) is None:
        return False
    return held.lock is None or held.lock.back


def lock_open_saga(saga_id: Any) -> Saga:
    """lock_saga() for the writes that start work (a collaborator joins, a form, a spawn, a
    broadcast, a steering message): a finished saga refuses them with `saga_finished`. An ask does
    the same with lock_saga() and check_open(), reading the status with the rest it decides on.
    What ends work (replies, cancellations, a turn coming to rest, shutdowns) takes lock_saga()."""
    saga = lock_saga(saga_id)
    check_open(locked_status(saga))
    return saga


def locked_status(saga: Saga) -> str:
    """The status of a saga whose lock this transaction holds (lock_saga()), as of the lock."""
    status = saga.status
    held = _held_lock.get()
    if held is not None and held.saga is saga and not held.current:
        # The copy saga_transaction() was given may have been read before a finish that committed
        # ahead of this transaction (an orchestration step's copy, read before its router call).
        if held.lock is not None:
            rows = held.lock()
        else:
            with connection.cursor() as cursor:
                cursor.execute(_STATUS_SQL, [db_value(Saga, "id", saga.pk)])
                rows = cursor.fetchall()
        status = rows[0][0] if rows else status
    return str(status)


def check_open(status: str) -> None:
    """A finished saga (`status`, as read under its lock) refuses the writes that start work."""
    if status != Saga.Status.OPEN:
        raise errors.SagaFinished(f"The saga is {status}: it takes no new work.", saga_status=status)


_STATUS_SQL = f"SELECT status FROM {Saga._meta.db_table} WHERE id = %s"
_LOCK_SQL = f"{_STATUS_SQL} FOR NO KEY UPDATE"


@contextmanager
def saga_transaction(saga: Saga, *, current: bool = False) -> Iterator[Saga]:
    """A transaction that takes the saga's lock first and holds it to the end, for callers that
    run several actions in one transaction (a turn of an internal run).

    The caller's copy serves and nothing is read. On SQLite, BEGIN IMMEDIATE has already taken the
    database's one write lock; elsewhere the row lock goes first, in one message with the
    transaction's first statement (config.sql.defer). The row's one column that changes, `status`,
    changes only in finish_saga(), which ends every run of the saga in the same transaction. So
    lock_open_saga() reads the status again for the writes that start work (on PostgreSQL the lock
    reads it, and the answer comes back with that first statement's), unless the caller says its
    copy is `current`: a turn's transaction, which starts by proving its run's lease under this
    lock (claimed_run, prove_lease) and rolls back whole if it cannot; a run that still holds its
    lease there belongs to a saga that was open when the lock was taken, and stays so until it is
    released.
    """
    with transaction.atomic():
        lock = None if connection.vendor == "sqlite" else rows_later(_LOCK_SQL, [saga.pk])
        with holding(saga, current=current, lock=lock):
            yield saga


@contextmanager
def holding(saga: Saga, *, current: bool, lock: RowsLater | None = None) -> Iterator[Saga]:
    """Inside a transaction that has taken the saga's lock (or sent its statement, `lock`, to go
    with the next): the actions called meanwhile find it held (lock_saga(), held_saga());
    `current` as in saga_transaction()."""
    token = _held_lock.set(HeldLock(saga, current, lock))
    try:
        yield saga
    finally:
        _held_lock.reset(token)
