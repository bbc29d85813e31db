"""Who sees whom and who may address whom (DESIGN.md §4). Reads only; grants are written by actions."""

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import F
from guardian.models import UserObjectPermission

from sagas.models import Collaborator, Saga

ADDRESS_PERM = "address_collaborator"


@dataclass(frozen=True)
class SagaTree:
    """A saga's collaborators (with their runs) and its delegation edges, loaded in one query."""

    saga: Saga
    members: dict[int, Collaborator]
    parent: dict[int, int]  # delegate id → delegator id

    @classmethod
    def load(cls, saga: Saga) -> "SagaTree":
        rows = (
            Collaborator.objects.filter(saga=saga).select_related("run").annotate(parent_id=F("delegation__delegator"))
        )
        members: dict[int, Collaborator] = {c.pk: c for c in rows}
        return cls(saga=saga, members=members, parent={c.pk: c.parent_id for c in rows if c.parent_id is not None})

    def children(self) -> dict[int, list[int]]:
        result: dict[int, list[int]] = defaultdict(list)
        for child, parent in self.parent.items():
            result[parent].append(child)
        return result

    def ancestors(self, cid: int) -> list[int]:
        chain = []
        while (cid := self.parent.get(cid)) is not None:  # type: ignore[assignment]
            chain.append(cid)
        return chain

    def descendants(self, cid: int) -> set[int]:
        children, found, todo = self.children(), set(), [cid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.add(child)
                todo.append(child)
        return found

    def siblings(self, cid: int) -> set[int]:
        parent = self.parent.get(cid)
        return {c for c, p in self.parent.items() if p == parent and c != cid} if parent is not None else set()

    def visible_ids(self, caller: Collaborator) -> set[int]:
        """Itself, its ancestors and descendants, its siblings where the policy allows, and every person.

        People see everyone: they are the ones the saga works for.
        """
        if not caller.is_agent:
            return set(self.members)
        ids = {caller.pk, *self.ancestors(caller.pk), *self.descendants(caller.pk)}
        if self.saga.policy != Saga.Policy.HUB:
            ids |= self.siblings(caller.pk)
        ids |= {c.pk for c in self.members.values() if not c.is_agent}
        return ids

    def addressable_ids(self, caller: Collaborator) -> set[int]:
        """The agents caller may address under the saga's policy.

        Every set here is inside what caller's delegator can see (its delegator, the delegator's
        delegates and their descendants, the delegator's ancestors), so a nested delegate never
        gains reach beyond its delegator's.
        """
        if not caller.is_agent:
            return set()
        parent = self.parent.get(caller.pk)
        policy = self.saga.policy
        if policy == Saga.Policy.HUB:
            ids = {parent} if parent is not None else set()
        elif policy == Saga.Policy.TREE:
            own_delegates = {c for c, p in self.parent.items() if p == caller.pk}
            ids = {*(() if parent is None else (parent,)), *own_delegates, *self.siblings(caller.pk)}
        else:
            ids = self.visible_ids(caller) - {caller.pk}
        return {i for i in ids if self.members[i].is_agent}


def collaborator_card(collaborator: Collaborator) -> dict[str, Any]:
    """What `get_collaborators` says of one collaborator: never a token, a username or an email."""
    card: dict[str, Any] = {
        "id": collaborator.handle,
        "kind": collaborator.kind,
        "role": collaborator.role,
        "task": collaborator.task,
    }
    if collaborator.is_agent:
        card["status"] = collaborator.run.status
        card["run_id"] = collaborator.run.pk
        if collaborator.run.team_id is not None:
            card["team_status"] = collaborator.run.team_status
    return card


def visible_collaborators(caller: Collaborator) -> list[Collaborator]:
    tree = SagaTree.load(caller.saga)
    ids = tree.visible_ids(caller)
    return [c for c in tree.members.values() if c.pk in ids]


def sync_address_grants(saga: Saga) -> None:
    """Make the `address_collaborator` object permissions match the policy for the whole saga."""
    tree = SagaTree.load(saga)
    ctype = ContentType.objects.get_for_model(Collaborator)
    perm = ctype.permission_set.get(codename=ADDRESS_PERM)
    wanted = {(tree.members[a].user_id, str(b)) for a in tree.members for b in tree.addressable_ids(tree.members[a])}
    existing = UserObjectPermission.objects.filter(
        permission=perm, content_type=ctype, object_pk__in=[str(pk) for pk in tree.members]
    )
    have = {(row.user_id, row.object_pk): row.pk for row in existing}
    stale = [pk for key, pk in have.items() if key not in wanted]
    if stale:
        UserObjectPermission.objects.filter(pk__in=stale).delete()
    UserObjectPermission.objects.bulk_create(
        UserObjectPermission(user_id=user_id, permission=perm, content_type=ctype, object_pk=object_pk)
        for user_id, object_pk in wanted - set(have)
    )


def may_address(sender: Collaborator, recipient: Collaborator) -> bool:
    """The `address_collaborator` object permission, read from guardian's table with one plain
    statement: agents hold it directly (never through a group), and every ask reads it."""
    if not sender.user.is_active:
        return False
    with connection.cursor() as cursor:
        cursor.execute(_MAY_ADDRESS_SQL, [sender.user_id, str(recipient.pk), ADDRESS_PERM])
        return cursor.fetchone() is not None


_MAY_ADDRESS_SQL = (
    f"SELECT 1 FROM {UserObjectPermission._meta.db_table} AS grant_ "
    f"JOIN {Permission._meta.db_table} AS perm ON perm.id = grant_.permission_id "
    "WHERE grant_.user_id = %s AND grant_.object_pk = %s AND perm.codename = %s LIMIT 1"
)


def may_manage(user: Any, saga: Saga) -> bool:
    return bool(user.is_superuser or saga.owner_id == user.pk or user.has_perm("sagas.manage_saga", saga))


def collaborator_for(user: Any, saga: Saga) -> Collaborator | None:
    """The caller's own collaborator in this saga, if it has one."""
    return Collaborator.objects.filter(saga=saga, user=user).select_related("saga", "user").first()
