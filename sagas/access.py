"""Who sees whom and who may address whom (DESIGN.md §4). Reads only; grants are written by actions."""

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connection
from django.db.models import F, Model, QuerySet
from guardian.models import UserObjectPermission

from config.sql import db_value, prepared, rows_later
from journal.models import JournalEvent
from sagas.models import AgentRequest, Collaborator, Delegation, HumanRequest, Run, Saga

logger = logging.getLogger(__name__)

ADDRESS_PERM = "address_collaborator"


class Node(Protocol):
    """What the tree's rules read of a collaborator: a `Collaborator` row, or a lighter `Member`."""

    @property
    def pk(self) -> Any: ...
    @property
    def user_id(self) -> Any: ...
    @property
    def handle(self) -> str: ...
    @property
    def is_agent(self) -> bool: ...


N = TypeVar("N", bound=Node)


@dataclass(frozen=True, slots=True)
class Member:
    """A collaborator as `SagaTree.shape` reads it: who it is, the team its run is in and the
    run's status (an agent that has ended delegates no more)."""

    pk: int
    kind: str
    name: str
    user_id: int
    team_id: int | None
    run_status: str | None = None

    @property
    def handle(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def is_agent(self) -> bool:
        return self.kind == Collaborator.Kind.AGENT


# SagaTree.shape(): every collaborator as a Member, with its delegator; in the order they joined.
_SHAPE_SQL = prepared(
    f"SELECT c.id, c.kind, c.name, c.user_id, r.team_id, r.status, d.delegator_id FROM {Collaborator._meta.db_table} c "
    f"LEFT JOIN {Run._meta.db_table} r ON r.collaborator_id = c.id "
    f"LEFT JOIN {Delegation._meta.db_table} d ON d.delegate_id = c.id "
    "WHERE c.saga_id = %s ORDER BY c.joined_at, c.id"
)


@dataclass(frozen=True)
class SagaTree(Generic[N]):
    """A saga's collaborators and its delegation edges, loaded in one query: whole rows with their
    runs (`load`), or only what the rules need (`shape`), several times cheaper in a large saga."""

    saga: Saga
    members: dict[int, N]
    parent: dict[int, int]  # delegate id → delegator id

    @classmethod
    def load(cls, saga: Saga) -> "SagaTree[Collaborator]":
        rows = (
            Collaborator.objects.filter(saga=saga).select_related("run").annotate(parent_id=F("delegation__delegator"))
        )
        members: dict[int, Collaborator] = {c.pk: c for c in rows}
        return SagaTree(saga=saga, members=members, parent={c.pk: c.parent_id for c in rows if c.parent_id is not None})

    @classmethod
    def shape(cls, saga: Saga) -> "SagaTree[Member]":
        with connection.cursor() as cursor:
            cursor.execute(_SHAPE_SQL, [db_value(Saga, "id", saga.pk)])
            return cls.shaped(saga, cursor.fetchall())

    @classmethod
    def shape_later(cls, saga: Saga) -> "Callable[[], SagaTree[Member]]":
        """shape(), its statement sent with the next one (config.sql.rows_later): the tree when
        called."""
        rows = rows_later(_SHAPE_SQL, [db_value(Saga, "id", saga.pk)])
        return lambda: cls.shaped(saga, rows())

    @staticmethod
    def shaped(saga: Saga, rows: Sequence[tuple[Any, ...]]) -> "SagaTree[Member]":
        return SagaTree(
            saga=saga,
            members={row[0]: Member(*row[:6]) for row in rows},
            parent={row[0]: row[6] for row in rows if row[6] is not None},
        )

    def with_delegates(self, delegator: Node, delegates: list[N]) -> "SagaTree[N]":
        """This tree with `delegates` added under `delegator`."""
        return SagaTree(
            saga=self.saga,
            members={**self.members, **{c.pk: c for c in delegates}},
            parent={**self.parent, **{c.pk: delegator.pk for c in delegates}},
        )

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

    def visible_ids(self, caller: Node) -> set[int]:
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

    def addressable_ids(self, caller: Node) -> set[int]:
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


def permission_id(model: type[Model], codename: str) -> tuple[int, int]:
    """The content type and permission ids of a model's permission, read once per process (they
    change only when the tables are flushed, which migrates again: post_migrate forgets them)."""
    key = (model._meta.label, codename)
    if key not in _permission_ids:
        ctype = ContentType.objects.get_for_model(model)
        _permission_ids[key] = (ctype.pk, ctype.permission_set.values_list("pk", flat=True).get(codename=codename))
    return _permission_ids[key]


_permission_ids: dict[tuple[str, str], tuple[int, int]] = {}
# The permissions every delegation grants (add_agents): who joins sees the saga, and who may address whom.
GRANTED: list[tuple[type[Model], str]] = [(Saga, "view_saga"), (Collaborator, ADDRESS_PERM)]


def forget_permission_ids(**_: Any) -> None:
    _permission_ids.clear()


def warm_permission_ids(**_: Any) -> None:
    """At a worker's start, before it forks its pool processes (Celery's `worker_init`): read the
    ids of the permissions GRANTED, which each pool process would otherwise read (four statements)
    at its first delegation, then close the connection: the pool processes open their own. A
    database that does not answer yet leaves the reads to them."""
    try:
        for model, codename in GRANTED:
            permission_id(model, codename)
    except DatabaseError:
        logger.warning("permission ids not read at the worker's start: each pool process reads them")
    finally:
        connection.close()


def may_address(sender: Collaborator, recipient: Collaborator, *, granted: bool | None = None) -> bool:
    """The `address_collaborator` object permission, read from guardian's table with one plain
    statement: agents hold it directly (never through a group), and every ask reads it. `granted`:
    whether the grant exists, as a caller read it already (ask_agent, in its own statement, with
    address_grant_sql())."""
    if not sender.user.is_active:
        return False
    if granted is not None:
        return granted
    with connection.cursor() as cursor:
        cursor.execute(_MAY_ADDRESS_SQL, [sender.user_id, str(recipient.pk), ADDRESS_PERM])
        return cursor.fetchone() is not None


def address_grant_sql(object_pk: str) -> str:
    """The rows of the `address_collaborator` grant (`%s` its codename) of a user (`%s` its id, the
    statement's first parameter) on the collaborator whose id, as text, is `object_pk` (a `%s` or
    an expression of the enclosing statement)."""
    return (
        f"SELECT 1 FROM {UserObjectPermission._meta.db_table} AS grant_ "
        f"JOIN {Permission._meta.db_table} AS perm ON perm.id = grant_.permission_id "
        f"WHERE grant_.user_id = %s AND grant_.object_pk = {object_pk} AND perm.codename = %s"
    )


_MAY_ADDRESS_SQL = address_grant_sql("%s") + " LIMIT 1"


def may_manage(user: Any, saga: Saga) -> bool:
    return bool(user.is_superuser or saga.owner_id == user.pk or user.has_perm("sagas.manage_saga", saga))


def collaborator_for(user: Any, saga: Saga) -> Collaborator | None:
    """The caller's own collaborator in this saga, if it has one."""
    return Collaborator.objects.filter(saga=saga, user=user).select_related("saga", "user").first()


# --- the journal, seen by one reader ---------------------------------------------------------------

E = TypeVar("E")
# Both handle prefixes of a collaborator; any other actor (empty, the system) names nobody.
HANDLE_PREFIXES = (f"{Collaborator.Kind.AGENT}:", f"{Collaborator.Kind.HUMAN}:")


def named_in(data: dict[str, Any]) -> list[Any]:
    """The collaborators an event's data names besides its parties (see JournalLens)."""
    return [data.get("id"), data.get("lead"), data.get("teammate")]


class JournalLens:
    """What one reader may see of one saga's journal: DESIGN.md §4 applied to events.

    Managers (and superusers) see every event. Anyone else sees:
    - an event about requests, forms or messages (its data names a `request_id`, a
      `human_request_id` or a `to`) only when the reader is one of its two parties: the sender
      and the recipient of the request, the asker and the addressee of the form, the author and
      the addressee of the message;
    - a team's broadcast only when the reader sent it, leads the team or is one of its recipients;
    - any other event when every collaborator it names (its actor, and in its data the `id` of
      who joined or was exposed, whose token changed, a team's `lead`, a `teammate`) is one the
      reader sees: for an agent, `SagaTree.visible_ids`; for a person, everyone.

    Built once per reader and read per batch of events (a WebSocket keeps one for its life): the
    tree is loaded again only when an event names a collaborator the lens has not met, and the
    parties of a request or form that its events do not name are read once per batch and kept.
    Works on `JournalEvent` rows and on their `as_dict()` alike.
    """

    def __init__(self, user: Any, saga: Saga) -> None:
        self.saga = saga
        self.user = user
        self.everything = may_manage(user, saga)
        self.me = ""
        self.known: set[str] = set()
        self.seen: set[str] = set()
        self.parties: dict[str, frozenset[str]] = {}  # "request:<id>" or "form:<id>" → its two handles
        if not self.everything:
            self.load_tree()

    def load_tree(self) -> None:
        tree = SagaTree.shape(self.saga)
        me = next((c for c in tree.members.values() if c.user_id == self.user.pk), None)
        self.me = me.handle if me is not None else ""
        self.known = {c.handle for c in tree.members.values()}
        ids = tree.visible_ids(me) if me is not None else set(tree.members)
        self.seen = {tree.members[i].handle for i in ids}

    def visible(self, events: Sequence[E]) -> list[E]:
        """The events of `events` this reader may see, in their order."""
        if self.everything:
            return list(events)
        fields = [event_fields(e) for e in events]
        named = {h for _, actor, data in fields for h in (actor, *named_in(data), data.get("to"), data.get("from"))}
        if any(isinstance(h, str) and h.startswith(HANDLE_PREFIXES) and h not in self.known for h in named):
            self.load_tree()  # someone joined since the lens was built
        self.read_parties(fields)
        return [
            event for event, (type_, actor, data) in zip(events, fields, strict=True) if self.sees(type_, actor, data)
        ]

    def sees(self, type_: str, actor: str, data: dict[str, Any]) -> bool:
        parties = self.parties_of(type_, actor, data)
        if parties is not None:
            return bool(self.me) and self.me in parties
        return all(self.may_see(h) for h in (actor, *named_in(data)))

    def may_see(self, handle: Any) -> bool:
        if not isinstance(handle, str) or not handle.startswith(HANDLE_PREFIXES):
            return True  # the event names no collaborator (the saga, the system)
        return handle in self.seen

    @staticmethod
    def party_key(data: dict[str, Any]) -> str | None:
        if "request_id" in data:
            return f"request:{data['request_id']}"
        if "human_request_id" in data:
            return f"form:{data['human_request_id']}"
        return None

    def parties_of(self, type_: str, actor: str, data: dict[str, Any]) -> frozenset[str] | None:
        """The parties of a request, form or message event (its two ends), or of a broadcast (its
        sender, its lead and its recipients); None for any other event."""
        key = self.party_key(data)
        if key is not None:
            return self.parties.get(key, frozenset())  # unknown (never in this saga): nobody's
        if "to" in data:
            return frozenset({actor, str(data["to"])})
        if type_ == "team.broadcast":
            return frozenset({actor, str(data.get("lead")), *map(str, data.get("recipients") or [])})
        return None

    def read_parties(self, fields: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Learn the parties of the requests and forms of a batch, from the events that name them
        (`request.created`, `human_request.created` and the request's terminal events), else from
        the rows, in one query per kind."""
        missing: dict[str, set[str]] = {"request": set(), "form": set()}
        for type_, actor, data in fields:
            key = self.party_key(data)
            if key is None or key in self.parties:
                continue
            if type_ in ("request.created", "human_request.created") and "to" in data:
                self.parties[key] = frozenset({actor, str(data["to"])})
            elif "from" in data and "to" in data:
                self.parties[key] = frozenset({str(data["from"]), str(data["to"])})
            else:
                kind, _, pk = key.partition(":")
                missing[kind].add(pk)
        if missing["request"]:
            rows = AgentRequest.objects.filter(saga=self.saga, pk__in=missing["request"]).values_list(
                "pk", "sender__kind", "sender__name", "recipient__kind", "recipient__name"
            )
            for pk, sk, sn, rk, rn in rows:
                self.parties[f"request:{pk}"] = frozenset({f"{sk}:{sn}", f"{rk}:{rn}"})
        if missing["form"]:
            forms = HumanRequest.objects.filter(saga=self.saga, pk__in=missing["form"]).values_list(
                "pk", "asker__kind", "asker__name", "addressee__kind", "addressee__name"
            )
            for pk, ak, an, dk, dn in forms:
                self.parties[f"form:{pk}"] = frozenset({f"{ak}:{an}", f"{dk}:{dn}"})

    def take(
        self, events: "QuerySet[JournalEvent]", limit: int, *, newest_first: bool = False
    ) -> tuple[list[JournalEvent], bool]:
        """Up to `limit` visible events of `events` in seq order (or newest first), and whether
        more visible ones follow: hidden events are skipped, read in chunks by seq."""
        found: list[JournalEvent] = []
        chunk = max(limit + 1, 100)
        ordered = events.order_by("-seq" if newest_first else "seq")
        while True:
            batch = list(ordered[:chunk])
            found += self.visible(batch)
            if len(found) > limit or len(batch) < chunk:
                return found[:limit], len(found) > limit
            edge = batch[-1].seq
            ordered = ordered.filter(seq__lt=edge) if newest_first else ordered.filter(seq__gt=edge)


def event_fields(event: Any) -> tuple[str, str, dict[str, Any]]:
    """(type, actor, data) of a `JournalEvent` or of its `as_dict()`."""
    if isinstance(event, dict):
        type_, actor, data = event.get("type", ""), event.get("actor", ""), event.get("data")
    else:
        type_, actor, data = event.type, event.actor, event.data
    return str(type_), str(actor or ""), data if isinstance(data, dict) else {}
