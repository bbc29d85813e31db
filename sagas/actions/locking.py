"""The saga lock every write takes first, and the transaction a turn holds it in.

Every action starts by locking the saga row: all of a saga's writes already queue on its journal
head, so taking that place in line first costs nothing and rules out lock-order deadlocks.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import connection, transaction

from config.sql import defer
from sagas import errors
from sagas.models import Saga

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


def lock_open_saga(saga_id: Any) -> Saga:
    """lock_saga() for the writes that start work (a collaborator joins, an ask, a form, a spawn, a
    broadcast, a steering message): a finished saga refuses them with `saga_finished`. What ends
    work (replies, cancellations, a turn coming to rest, shutdowns) takes lock_saga() and goes on."""
    saga = lock_saga(saga_id)
    status = saga.status
    if _held_lock.get() is saga:
        # The copy saga_transaction() was given may have been read before a finish that committed
        # ahead of this transaction (an orchestration step's copy, read before its router call).
        status = Saga.objects.filter(pk=saga.pk).values_list("status", flat=True).first() or status
    if status != Saga.Status.OPEN:
        raise errors.SagaFinished(f"The saga is {status}: it takes no new work.", saga_status=status)
    return saga


_LOCK_SQL = f"SELECT 1 FROM {Saga._meta.db_table} WHERE id = %s FOR NO KEY UPDATE"


@contextmanager
def saga_transaction(saga: Saga) -> Iterator[Saga]:
    """A transaction that takes the saga's lock first and holds it to the end, for callers that
    run several actions in one transaction (a turn of an internal run).

    The caller's copy serves and nothing is read. On SQLite, BEGIN IMMEDIATE has already taken the
    database's one write lock; elsewhere the row lock goes first, in one message with the
    transaction's first statement (config.sql.defer). The row's one column that changes, `status`,
    changes only in finish_saga(), which ends every run of the saga in the same transaction; a
    turn's transaction starts by proving its run's lease (take_turn, renew_lease), so none acts on a
    finished saga, and lock_open_saga() reads the status again for the writes that start work.
    """
    with transaction.atomic():
        if connection.vendor != "sqlite":
            defer(_LOCK_SQL, [saga.pk])
        token = _held_lock.set(saga)
        try:
            yield saga
        finally:
            _held_lock.reset(token)
