"""Collaborators and delegations: agents and people joining a saga."""

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Model
from django.utils.module_loading import import_string
from guardian.models import UserObjectPermission
from guardian.shortcuts import assign_perm

from accounts.actions import create_agent_users, issue_token
from accounts.models import User
from config.sql import insert_all, keys_later
from journal.actions import record
from sagas import errors
from sagas.access import ADDRESS_PERM, Member, SagaTree, may_manage, permission_id
from sagas.actions import payloads
from sagas.actions.caps import check_delegate_caps
from sagas.actions.locking import check_open, lock_open_saga, lock_saga, locked_status
from sagas.actions.payloads import check_goal
from sagas.models import Collaborator, Delegation, Run, Saga
from sagas.wakeups import ring_run_after_commit

NAME_PATTERN = r"[a-z0-9][a-z0-9_.-]{0,63}"
NAME_RE = re.compile(NAME_PATTERN)  # whole names only: fullmatch (`$` admits a final newline)
ROLE_MAX = Collaborator._meta.get_field("role").max_length or 0
PROFILE_MAX = Collaborator._meta.get_field("profile").max_length or 0
Grant = tuple[int, str, type[Model], Any]  # guardian's object permission: user id, codename, model, object id


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
    idempotency_key: str = ""  # its caller's (payloads.caller_key), with the body it was for
    body_hash: str = ""


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
    runs, permissions), so that a Brain's support workers cost one step, not one per worker; the
    writes whose keys nothing here reads (delegations, runs, grants) go with the next statement
    (config.sql.defer). Returns each collaborator, in order, with its token (external agents only)."""
    saga = lock_saga(saga.pk)
    # Read once: who acts, the parent, the names taken, the caps, the grants; sent with the
    # profile names' read, which brings the saga's status too when the caller's transaction holds
    # its lock already, and the new users' and collaborators' keys, so that their rows go deferred
    # like the rest (one message on PostgreSQL).
    keys_read = keys_later([User, Collaborator], len(agents))
    tree_later = SagaTree.shape_later(saga)
    check_new_agents(agents)
    check_open(locked_status(saga))
    tree = tree_later()
    acting = next((c for c in tree.members.values() if c.user_id == by.pk), None)
    delegator = resolve_parent(tree, parent, by=by, acting=acting)
    if delegator.run_status in Run.FINISHED:  # as for its asks: a resumable one reports `working` first
        raise errors.InvalidState(f"{delegator.handle} has ended ({delegator.run_status}): it delegates no more.")
    if delegator.team_id is not None:  # its delegates would work outside its team's budget of tokens
        raise errors.NotTeamLead(
            f"{delegator.handle} is a teammate: teammates lead none, delegates included. Ask the team's lead."
        )
    names = [agent.name for agent in agents]
    taken = {c.name for c in tree.members.values() if c.is_agent}
    if taken & set(names) or len(set(names)) < len(names):
        again = next(n for i, n in enumerate(names) if n in taken or n in names[:i])
        raise errors.NameTaken(f"agent:{again} is already in this saga.")
    for name in names:
        check_namespace(name, taken, delegator)
    check_delegate_caps(tree, delegator, adding=len(agents))
    keys = keys_read() if keys_read is not None else None
    users = create_agent_users(
        usernames=[f"agent.{saga.pk.hex[:12]}.{agent.name}" for agent in agents],
        keys=[user_key for user_key, _ in keys] if keys is not None else None,
    )
    own_keys = [key for _, key in keys] if keys is not None else [None] * len(agents)
    collaborators = insert_all([
        Collaborator(pk=key, saga=saga, kind=Collaborator.Kind.AGENT, name=agent.name, role=agent.role,
                     task=agent.task, user=user, runtime=agent.runtime, profile=agent.profile,
                     idempotency_key=agent.idempotency_key, body_hash=agent.body_hash)
        for agent, user, key in zip(agents, users, own_keys, strict=True)
    ], later=keys is not None)  # fmt: skip
    insert_all([
        Delegation(saga=saga, delegator_id=delegator.pk, delegate=collaborator, task=collaborator.task)
        for collaborator in collaborators
    ], later=True)  # fmt: skip
    internal = [agent.runtime == Collaborator.Runtime.INTERNAL for agent in agents]
    runs = insert_all([
        Run(collaborator=collaborator, status=Run.Status.QUEUED if inside else Run.Status.IDLE,
            resumable=agent.resumable)
        for agent, collaborator, inside in zip(agents, collaborators, internal, strict=True)
    ], later=True)  # fmt: skip
    views = [(user.pk, "view_saga", Saga, saga.pk) for user in users]
    newcomers = [Member(c.pk, c.kind, c.name, c.user_id, None) for c in collaborators]
    grant_permissions(views + address_grants(tree.with_delegates(delegator, newcomers), newcomers))
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


def address_grants(tree: SagaTree[Member], newcomers: list[Member]) -> list[Grant]:
    """The `address_collaborator` grants that newcomers (in tree already) bring under the saga's
    policy: theirs, and the others' on them. Newcomers change no pair between the others (each rule
    looks only at the delegations above and between the two), so nothing is read or removed."""
    new = {c.pk for c in newcomers}
    return [
        (tree.members[a].user_id, ADDRESS_PERM, Collaborator, b)
        for a in tree.members for b in tree.addressable_ids(tree.members[a]) if a in new or b in new
    ]  # fmt: skip


def grant_permissions(grants: list[Grant]) -> None:
    """guardian's object permissions `(user id, codename, model, object id)`, written in one
    deferred statement with no lookup of the permissions (guardian's `assign_perm` reads each one
    first)."""
    rows = []
    for user_id, codename, model, pk in grants:
        ctype_id, perm_id = permission_id(model, codename)
        rows.append(UserObjectPermission(user_id=user_id, permission_id=perm_id, content_type_id=ctype_id,
                                         object_pk=str(pk)))  # fmt: skip
    insert_all(rows, ignore_conflicts=True, later=True)


def check_new_agents(agents: list[NewAgent]) -> None:
    for agent in agents:
        if not isinstance(agent.name, str) or not NAME_RE.fullmatch(agent.name):
            raise errors.InvalidPayload(
                "Bad agent name.", errors={"name": ["Lowercase letters, digits, '.', '_' and '-'."]}
            )
        check_goal(agent.task, field="task")
        check_role(agent.role)
        if agent.runtime not in (Collaborator.Runtime.INTERNAL, Collaborator.Runtime.EXTERNAL):
            raise errors.InvalidPayload("Bad runtime.", errors={"runtime": ["internal or external."]})
        if not isinstance(agent.profile, str) or len(agent.profile) > PROFILE_MAX:
            raise errors.InvalidPayload(
                "Bad profile.", errors={"profile": [f"A profile's name, at most {PROFILE_MAX} characters."]}
            )
        if agent.runtime == Collaborator.Runtime.INTERNAL and not agent.profile:
            raise errors.InvalidPayload("An internal agent needs a profile.", errors={"profile": ["Required."]})
    profiles = [agent.profile for agent in agents if agent.runtime == Collaborator.Runtime.INTERNAL]
    missing = missing_profiles(set(profiles)) if profiles else set()
    if missing:
        name = next(profile for profile in profiles if profile in missing)
        raise errors.InvalidPayload(
            f"No agent profile {name}.", errors={"profile": [f"No profile {name}; `load_profiles` adds profiles."]}
        )


def check_namespace(name: str, agents: set[str], delegator: Member) -> None:
    """A name under an agent's (`lead.tester`, once `agent:lead` is in the saga) is that agent's to
    give: only its own delegates take it, so that names an agent derives for its delegates (an
    orchestration's workers, `brain-….tester`) cannot be taken first by anyone else."""
    parts = name.split(".")
    owner = next((p for i in range(len(parts) - 1, 0, -1) if (p := ".".join(parts[:i])) in agents), None)
    if owner is not None and not (delegator.is_agent and delegator.name == owner):
        raise errors.NameTaken(f"agent:{name} is under agent:{owner}'s name: only its own delegates take it.")


def check_role(role: Any) -> None:
    if not isinstance(role, str) or len(role) > ROLE_MAX:
        raise errors.InvalidPayload("Bad role.", errors={"role": [f"Text of at most {ROLE_MAX} characters."]})


def resolve_parent(tree: SagaTree[Member], parent: str | None, *, by: User, acting: Member | None) -> Member:
    """The delegator of a new agent: the named parent, or (for managers) the saga's owner."""
    if acting is not None and acting.is_agent and parent == acting.handle:
        return acting  # an agent's own delegate, whether it manages the saga or not: no permission to read
    if not may_manage(by, tree.saga):
        if acting is None or not acting.is_agent:
            raise errors.Forbidden("Only managers of the saga add collaborators.")
        if parent not in (None, acting.handle):
            raise errors.Forbidden("An agent may add only its own delegates.")
        return acting
    found = next(
        (c for c in tree.members.values() if (c.handle == parent if parent else c.user_id == tree.saga.owner_id)), None
    )
    if found is None:
        raise errors.NotFound(f"No collaborator {parent or 'for the saga owner'} in this saga.")
    return found


@transaction.atomic
def add_human(
    *, saga: Saga, user: User, role: str, task: str, by: User, idempotency_key: str = "", body_hash: str = ""
) -> Collaborator:
    saga = lock_open_saga(saga.pk)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga add collaborators.")
    check_goal(task, field="task")
    check_role(role)
    if user.is_agent:
        raise errors.InvalidPayload("That user is an agent.", errors={"username": ["Not a person."]})
    if Collaborator.objects.filter(saga=saga, user=user).exists():
        raise errors.NameTaken(f"human:{user.username} is already in this saga.")
    collaborator = Collaborator.objects.create(
        saga=saga, kind=Collaborator.Kind.HUMAN, name=user.username, role=role, task=task, user=user,
        idempotency_key=idempotency_key, body_hash=body_hash,
    )  # fmt: skip
    assign_perm("sagas.view_saga", user, saga)
    record(
        saga_id=saga.pk,
        type="collaborator.joined",
        actor=actor_id(saga, by),
        data={"id": collaborator.handle, "kind": "human", "role": role, "task": task},
    )
    return collaborator


@transaction.atomic
def add_agent_once(
    *, saga: Saga, agent: NewAgent, by: User, parent: str | None = None, idempotency_key: str = ""
) -> tuple[Collaborator, str | None, bool]:
    """add_agent() once per Idempotency-Key of its caller; without one, every call adds. A retry
    with the same key and body returns the first agent and False, never with a token: an external
    agent's is in the first answer only (it is not stored), and one lost with that answer is
    replaced by a rotation (rotate_agent_token(), managers), not by a replay that might revoke a
    token in use. With another body, `idempotency_conflict`."""
    key, digest, first = "", "", None
    if idempotency_key:
        body = asdict(replace(agent, idempotency_key="", body_hash=""))  # what it adds, under whom
        key, digest, first = first_added(saga, by, idempotency_key, kind=Collaborator.Kind.AGENT, parent=parent,
                                         agent=body)  # fmt: skip
    if first is not None:
        return first, None, False
    ((added, token),) = add_agents(
        saga=saga, agents=[replace(agent, idempotency_key=key, body_hash=digest)], by=by, parent=parent
    )
    return added, token, True


@transaction.atomic
def add_human_once(
    *, saga: Saga, user: User, role: str, task: str, by: User, idempotency_key: str = ""
) -> tuple[Collaborator, bool]:
    """add_human() once per Idempotency-Key of its caller, as add_agent_once() adds an agent."""
    key, digest, first = "", "", None
    if idempotency_key:
        key, digest, first = first_added(
            saga, by, idempotency_key, kind=Collaborator.Kind.HUMAN, username=user.username, role=role, task=task
        )
    if first is not None:
        return first, False
    return add_human(saga=saga, user=user, role=role, task=task, by=by, idempotency_key=key, body_hash=digest), True


def first_added(saga: Saga, by: User, idempotency_key: str, **body: Any) -> tuple[str, str, Collaborator | None]:
    """Under the saga's lock, so that two retries at once add one: the caller's key as stored, the
    body's hash, and the collaborator they first added, if any (`idempotency_conflict` when that
    was for another body)."""
    lock_saga(saga.pk)
    key, digest = payloads.caller_key(by.pk, idempotency_key), payloads.body_hash(**body)
    first = payloads.first_for_key(
        Collaborator.objects.filter(saga=saga, idempotency_key=key).select_related("run"), digest,
        conflict="This Idempotency-Key was already used for a different collaborator.",
    )  # fmt: skip
    return key, digest, first


def find_collaborator(saga: Saga, handle: str) -> Collaborator | None:
    kind, _, name = handle.partition(":")
    if kind not in Collaborator.Kind.values or not name:
        return None
    return Collaborator.objects.filter(saga=saga, kind=kind, name=name).select_related("run", "user").first()


def missing_profiles(names: set[str]) -> set[str]:
    """Which of these agent profiles the runtime does not know (`AGORA_MISSING_PROFILES` names the
    callable that answers)."""
    return set(import_string(settings.AGORA_MISSING_PROFILES)(names))
