"""Collaborators and delegations: agents and people joining a saga."""

import re

from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string
from guardian.shortcuts import assign_perm

from accounts.actions import create_agent_user, issue_token
from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.access import may_manage, sync_address_grants
from sagas.actions.caps import check_delegate_caps
from sagas.actions.locking import lock_open_saga
from sagas.actions.payloads import check_goal
from sagas.models import Collaborator, Delegation, Run, Saga
from sagas.wakeups import ring_run_after_commit

NAME_PATTERN = r"[a-z0-9][a-z0-9_.-]{0,63}"
NAME_RE = re.compile(NAME_PATTERN)  # whole names only: fullmatch (`$` admits a final newline)


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
    saga = lock_open_saga(saga.pk)
    acting = acting_collaborator(saga, by)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise errors.InvalidPayload(
            "Bad agent name.", errors={"name": ["Lowercase letters, digits, '.', '_' and '-'."]}
        )
    check_goal(task, field="task")
    if runtime not in (Collaborator.Runtime.INTERNAL, Collaborator.Runtime.EXTERNAL):
        raise errors.InvalidPayload("Bad runtime.", errors={"runtime": ["internal or external."]})
    if runtime == Collaborator.Runtime.INTERNAL and not profile:
        raise errors.InvalidPayload("An internal agent needs a profile.", errors={"profile": ["Required."]})
    if runtime == Collaborator.Runtime.INTERNAL and not profile_exists(profile):
        raise errors.InvalidPayload(
            f"No agent profile {profile}.",
            errors={"profile": [f"No profile {profile}; `load_profiles` adds profiles."]},
        )
    delegator = resolve_parent(saga, parent, by=by, acting=acting)
    if Collaborator.objects.filter(saga=saga, kind=Collaborator.Kind.AGENT, name=name).exists():
        raise errors.NameTaken(f"agent:{name} is already in this saga.")
    check_delegate_caps(saga, delegator)
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
    saga = lock_open_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga add collaborators.")
    check_goal(task, field="task")
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


def profile_exists(name: str) -> bool:
    """Whether the runtime knows this agent profile (`AGORA_PROFILE_EXISTS` names its answer)."""
    return bool(import_string(settings.AGORA_PROFILE_EXISTS)(name))
