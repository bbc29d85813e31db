"""Which agents the protocol gateways may show to the outside: a manager's decision, journaled."""

from django.db import transaction

from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.access import may_manage
from sagas.actions.collaborators import actor_id, find_collaborator
from sagas.actions.locking import check_open, lock_saga, locked_status
from sagas.models import Collaborator, Saga


@transaction.atomic
def set_exposed(*, saga: Saga, handle: str, exposed: bool, by: User) -> Collaborator:
    """Expose an agent collaborator to A2A clients (it gets an agent card), or withdraw it. A
    finished saga exposes none (`saga_finished`, to its managers: a card would bring it new work);
    it withdraws."""
    saga = lock_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga expose its agents.")
    if exposed:
        check_open(locked_status(saga))
    collaborator = find_collaborator(saga, handle)
    if collaborator is None or not collaborator.is_agent:
        raise errors.NotFound(f"No agent {handle} in this saga.")
    if collaborator.exposed == exposed:
        return collaborator
    Collaborator.objects.filter(pk=collaborator.pk).update(exposed=exposed)
    collaborator.exposed = exposed
    record(
        saga_id=saga.pk,
        type="collaborator.exposed" if exposed else "collaborator.withdrawn",
        actor=actor_id(saga, by),
        data={"id": collaborator.handle, "exposed": exposed},
    )
    return collaborator
