"""Collaborators and delegations: agents and people joining a saga."""

import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string
from guardian.shortcuts import assign_perm

from accounts.actions import create_agent_users, issue_token
from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.access import SagaTree, may_manage, sync_address_grants
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


@dataclass(frozen=True)
class NewAgent:
    """One agent for `add_agents`: what `add_agent` takes besides the saga, the parent and `by`.
    Its first turn (internal) is rung after commit unless `ring` is False: then the caller runs it
    itself once the transaction commits (the queued run is the promise; the reconciler rings it
    when nobody does)."""

    name: str
    role: str
    task: str
    runtime: str
    profile: str = ""
    resumable: bool = False
    ring: bool = True


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
    ring: bool = True,
) -> tuple[Collaborator, str | None]:
    """Add an agent collaborator with its service user, its delegation and its run.

    Managers may add agents anywhere; an agent may add only its own delegates. Returns the
    collaborator and, for an external agent, its API token (shown this once). `ring`: see NewAgent.
    """
    agent = NewAgent(name=name, role=role, task=task, runtime=runtime, profile=profile, resumable=resumable, ring=ring)
    ((collaborator, token),) = add_agents(saga=saga, agents=[agent], by=by, parent=parent)
    return collaborator, token


@transaction.atomic
def add_agents(
    *, saga: Saga, agents: list[NewAgent], by: User, parent: str | None = None
) -> list[tuple[Collaborator, str | None]]:
    """Add agents under one parent, all or none, as `add_agent` adds one: with one lock, one check
    of each cap for all of them, and one write of each kind (users, collaborators, delegations,
    runs, permissions, address grants), so that a Brain's support workers cost one step, not one
    per worker. Returns each collaborator, in order, with its token (external agents only)."""
    saga = lock_open_saga(saga.pk)
    acting = acting_collaborator(saga, by)
    for agent in agents:
        check_new_agent(agent)
    delegator = resolve_parent(saga, parent, by=by, acting=acting)
    tree = SagaTree.load(saga)  # read once: the names taken, the caps, the address grants
    names = [agent.name for agent in agents]
    taken = {c.name for c in tree.members.values() if c.is_agent}
    if taken & set(names) or len(set(names)) < len(names):
        again = next(n for i, n in enumerate(names) if n in taken or n in names[:i])
        raise errors.NameTaken(f"agent:{again} is already in this saga.")
    check_delegate_caps(tree, delegator, adding=len(agents))
    users = create_agent_users(usernames=[f"agent.{saga.pk.hex[:12]}.{agent.name}" for agent in agents])
    collaborators = Collaborator.objects.bulk_create(
        Collaborator(saga=saga, kind=Collaborator.Kind.AGENT, name=agent.name, role=agent.role, task=agent.task,
                     user=user, runtime=agent.runtime, profile=agent.profile)
        for agent, user in zip(agents, users, strict=True)
    )  # fmt: skip
    Delegation.objects.bulk_create(
        Delegation(saga=saga, delegator=delegator, delegate=collaborator, task=collaborator.task)
        for collaborator in collaborators
    )
    internal = [agent.runtime == Collaborator.Runtime.INTERNAL for agent in agents]
    runs = Run.objects.bulk_create(
        Run(collaborator=collaborator, status=Run.Status.QUEUED if inside else Run.Status.IDLE,
            resumable=agent.resumable)
        for agent, collaborator, inside in zip(agents, collaborators, internal, strict=True)
    )  # fmt: skip
    assign_perm("sagas.view_saga", users, saga)
    sync_address_grants(saga, tree.with_delegates(delegator, collaborators))
    actor = acting.handle if acting else f"human:{by.username}"
    added = []
    for agent, collaborator, run, user, inside in zip(agents, collaborators, runs, users, internal, strict=True):
        record(
            saga_id=saga.pk,
            type="collaborator.joined",
            actor=actor,
            run_id=run.pk,
            data={"id": collaborator.handle, "kind": "agent", "role": agent.role, "task": agent.task,
                  "parent": delegator.handle, "runtime": agent.runtime, "profile": agent.profile},
        )  # fmt: skip
        if inside and agent.ring:
            ring_run_after_commit(run.pk)
        added.append((collaborator, None if inside else issue_token(user=user)))
    return added


def check_new_agent(agent: NewAgent) -> None:
    if not isinstance(agent.name, str) or not NAME_RE.fullmatch(agent.name):
        raise errors.InvalidPayload(
            "Bad agent name.", errors={"name": ["Lowercase letters, digits, '.', '_' and '-'."]}
        )
    check_goal(agent.task, field="task")
    if agent.runtime not in (Collaborator.Runtime.INTERNAL, Collaborator.Runtime.EXTERNAL):
        raise errors.InvalidPayload("Bad runtime.", errors={"runtime": ["internal or external."]})
    if agent.runtime == Collaborator.Runtime.INTERNAL and not agent.profile:
        raise errors.InvalidPayload("An internal agent needs a profile.", errors={"profile": ["Required."]})
    if agent.runtime == Collaborator.Runtime.INTERNAL and not profile_exists(agent.profile):
        raise errors.InvalidPayload(
            f"No agent profile {agent.profile}.",
            errors={"profile": [f"No profile {agent.profile}; `load_profiles` adds profiles."]},
        )


def resolve_parent(saga: Saga, parent: str | None, *, by: User, acting: Collaborator | None) -> Collaborator:
    """The delegator of a new agent: the named parent, or (for managers) the saga's owner."""
    if acting is not None and acting.is_agent and parent == acting.handle:
        return acting  # an agent's own delegate, whether it manages the saga or not: no permission to read
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
