"""An agent's API token: rotated or revoked by a manager of its saga, or by the agent itself."""

from django.db import transaction

from accounts.actions import revoke_tokens, rotate_token
from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.access import may_manage
from sagas.actions.collaborators import actor_id, find_collaborator
from sagas.actions.locking import check_open, lock_saga, locked_status
from sagas.models import Collaborator, Saga


def token_holder(saga: Saga, handle: str, by: User) -> Collaborator:
    """The agent whose token `by` may change: any agent of the saga for its managers, else itself."""
    agent = find_collaborator(saga, handle)
    if agent is None or not agent.is_agent:
        raise errors.NotFound(f"No agent {handle} in this saga.")
    if agent.user_id != by.pk and not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga, or the agent itself, change an agent's token.")
    return agent


@transaction.atomic
def rotate_agent_token(*, saga: Saga, handle: str, by: User) -> tuple[Collaborator, str]:
    """Revoke the agent's tokens and issue a new one (returned, shown once; journaled without it).
    An internal agent has none to rotate: Agora runs its turns, and no one else acts as it. A
    finished saga issues none (`saga_finished`, to whoever may rotate); revoking stays open to it."""
    saga = lock_saga(saga.pk)
    agent = token_holder(saga, handle, by)
    check_open(locked_status(saga))
    if agent.runtime == Collaborator.Runtime.INTERNAL:  # a token would let its holder act as the agent
        raise errors.InvalidState(f"{agent.handle} runs inside Agora: it has no API token.")
    key = rotate_token(user=agent.user)
    record(saga_id=saga.pk, type="collaborator.token_rotated", actor=actor_id(saga, by), data={"id": agent.handle})
    return agent, key


@transaction.atomic
def revoke_agent_token(*, saga: Saga, handle: str, by: User) -> Collaborator:
    """Revoke the agent's tokens: its next call, open WebSocket and long-poll are refused."""
    saga = lock_saga(saga.pk)
    agent = token_holder(saga, handle, by)
    revoke_tokens(user=agent.user)
    record(saga_id=saga.pk, type="collaborator.token_revoked", actor=actor_id(saga, by), data={"id": agent.handle})
    return agent
