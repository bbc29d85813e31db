"""What the dashboard shows: read models for the saga pages, each scoped to the person looking.

Reads only. Writes go through `sagas.actions`; who may see what is decided in `sagas.access` and
`Saga.objects.visible_to`, and every query here starts from a saga the caller may already see.
"""

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any, TypeVar

from django.db.models import Count, IntegerField, Max, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from journal.models import JournalEvent
from sagas.access import JournalLens, SagaTree, may_manage
from sagas.actions.teams import Teammate, lead_inbox, roster
from sagas.models import AgentRequest, Collaborator, HumanRequest, Run, Saga, SteeringItem
from sagas.models import Team as TeamModel

PAGE_SIZE = 50
FETCH_LIMIT = 200
WORKER_EVENTS = ("worker_start", "worker_end", "llm_call", "model_fallback")


# --- the saga list -----------------------------------------------------------------------------


def sagas_for(user: Any) -> QuerySet[Saga]:
    """The sagas user may see, with their last activity, size and the forms waiting for user."""
    events = JournalEvent.objects.filter(saga=OuterRef("pk")).order_by()
    members = Collaborator.objects.filter(saga=OuterRef("pk")).order_by().values("saga")
    waiting = HumanRequest.objects.filter(
        saga=OuterRef("pk"), addressee__user=user, status=HumanRequest.Status.PENDING
    ).order_by()
    return (
        Saga.objects.visible_to(user)
        .select_related("owner")
        .annotate(
            last_activity=Subquery(events.values("saga").annotate(m=Max("created_at")).values("m")[:1]),
            event_count=Coalesce(
                Subquery(events.values("saga").annotate(n=Count("pk")).values("n")[:1], output_field=IntegerField()),
                0,
            ),
            member_count=Coalesce(
                Subquery(members.annotate(n=Count("pk")).values("n")[:1], output_field=IntegerField()), 0
            ),
            waiting_for_me=Coalesce(
                Subquery(waiting.values("saga").annotate(n=Count("pk")).values("n")[:1], output_field=IntegerField()),
                0,
            ),
        )
        .order_by("-created_at")
    )


def pending_forms_for(user: Any) -> QuerySet[HumanRequest]:
    """Every form waiting for user's answer, across the sagas user still sees."""
    return (
        HumanRequest.objects.filter(
            addressee__user=user, status=HumanRequest.Status.PENDING, saga__in=Saga.objects.visible_to(user)
        )
        .select_related("saga", "asker")
        .order_by("created_at")
    )


# --- the team: delegation tree and roster ------------------------------------------------------


ROSTER = (
    ("working", "Working", (Run.Status.RUNNING, Run.Status.QUEUED)),
    ("waiting", "Waiting", (Run.Status.WAITING,)),
    ("idle", "Idle", (Run.Status.IDLE,)),
    ("finished", "Finished", Run.FINISHED),
)


@dataclass(frozen=True)
class Member:
    """One collaborator as a row of the tree: its depth, its delegator and its run."""

    collaborator: Collaborator
    run: Run | None
    depth: int
    parent: str
    is_me: bool

    @property
    def state(self) -> str:
        """The roster column: working, waiting, idle or finished (people have none)."""
        if self.run is None:
            return ""
        return next(key for key, _, statuses in ROSTER if self.run.status in statuses)


def a2a_card_url(base_url: str, collaborator: Collaborator) -> str:
    """Where an exposed agent's A2A card is: the gateway's route (gateways/a2a/asgi.py), which the
    dashboard may not import; tests/sagas/test_exposure_switch.py holds the two together."""
    return f"{base_url.rstrip('/')}/a2a/{collaborator.saga_id}/{collaborator.name}/.well-known/agent-card.json"


@dataclass(frozen=True)
class Team:
    members: list[Member]

    @property
    def agents(self) -> list[Member]:
        return [m for m in self.members if m.collaborator.is_agent]

    def roster(self) -> list[tuple[str, str, list[Member]]]:
        return [(key, label, [m for m in self.agents if m.state == key]) for key, label, _ in ROSTER]

    @property
    def counts(self) -> dict[str, int]:
        """Agents per roster column."""
        return {key: sum(1 for m in self.agents if m.state == key) for key, _, _ in ROSTER}

    @property
    def people(self) -> list[Member]:
        return [m for m in self.members if not m.collaborator.is_agent]


def team(saga: Saga, viewer: Any) -> Team:
    """The collaborators viewer may see, depth-first from the saga's owner along the delegations."""
    tree = SagaTree.load(saga)
    me = next((c for c in tree.members.values() if c.user_id == viewer.pk), None)
    visible = tree.visible_ids(me) if me is not None else set(tree.members)
    children = tree.children()
    for kids in children.values():
        kids.sort()
    owner = next((pk for pk, c in tree.members.items() if c.user_id == saga.owner_id), None)
    roots = sorted((pk for pk in tree.members if pk not in tree.parent), key=lambda pk: (pk != owner, pk))
    rows: list[Member] = []
    todo: list[tuple[int, int]] = [(pk, 0) for pk in reversed(roots)]
    while todo:
        pk, depth = todo.pop()
        collaborator = tree.members[pk]
        if pk in visible:
            parent = tree.parent.get(pk)
            rows.append(
                Member(
                    collaborator=collaborator,
                    run=getattr(collaborator, "run", None),
                    depth=depth,
                    parent=tree.members[parent].handle if parent is not None else "",
                    is_me=me is not None and pk == me.pk,
                )
            )
        todo.extend((child, depth + 1) for child in reversed(children.get(pk, [])))
    return Team(members=rows)


# --- requests ----------------------------------------------------------------------------------


def requests_for(saga: Saga, user: Any) -> QuerySet[AgentRequest]:
    """The saga's ask_agent requests user may read: all for managers, else those it sent or received.

    The same rule as `actions.get_request_for`, as one query.
    """
    requests = AgentRequest.objects.filter(saga=saga).select_related("sender", "recipient")
    if not may_manage(user, saga):
        requests = requests.filter(Q(sender__user=user) | Q(recipient__user=user))
    return requests


def request_board(saga: Saga, user: Any, *, limit: int = 100) -> tuple[list[AgentRequest], list[AgentRequest]]:
    """(open requests, oldest first; the most recently finished ones)."""
    finished = [s for s in AgentRequest.Status if s not in AgentRequest.OPEN]
    return open_and_done(
        requests_for(saga, user), AgentRequest.OPEN, finished, open_by="created_at", done_by="updated_at",
        open_limit=limit, done_limit=limit,
    )  # fmt: skip


M = TypeVar("M", AgentRequest, HumanRequest)


def open_and_done(
    rows: QuerySet[M], open_: Collection[str], done: Collection[str], *, open_by: str, done_by: str,
    open_limit: int | None, done_limit: int,
) -> tuple[list[M], list[M]]:  # fmt: skip
    """(rows with an open status, by `open_by`; the latest rows with a done status, newest `done_by`
    first), read in one statement: a row that closes meanwhile is in one list, never in both, as it
    could be if each list were a query of its own seeing its own moment."""
    first = rows.filter(status__in=open_).order_by(open_by).values("pk")[:open_limit]
    latest = rows.filter(status__in=done).order_by(f"-{done_by}").values("pk")[:done_limit]
    both = list(rows.filter(Q(pk__in=first) | Q(pk__in=latest)))
    return (
        sorted((r for r in both if r.status in open_), key=attrgetter(open_by)),
        sorted((r for r in both if r.status in done), key=attrgetter(done_by), reverse=True),
    )


# --- the inbox ---------------------------------------------------------------------------------


@dataclass
class BoundField:
    """A form field from an ask_human schema with what the person typed and what was wrong with it."""

    name: str
    label: str
    type: str
    required: bool
    choices: list[str]
    value: Any = None
    errors: list[str] = field(default_factory=list)

    @property
    def widget_id(self) -> str:
        return f"f-{self.name}"

    @property
    def values(self) -> list[str]:
        """The selected values of a multichoice field."""
        if isinstance(self.value, list):
            return [str(v) for v in self.value]
        return [] if self.value in (None, "") else [str(self.value)]


@dataclass
class InboxForm:
    human_request: HumanRequest
    fields: list[BoundField]
    errors: list[str] = field(default_factory=list)


Submitted = dict[str, tuple[dict[str, Any], dict[str, list[str]]]]


def inbox_for(saga: Saga, user: Any, *, bound: Submitted | None = None) -> tuple[list[InboxForm], list[HumanRequest]]:
    """(pending forms addressed to user in this saga, ready to render; the ones user answered).

    `bound` maps a form's id to (the submitted values, the errors per field) to show them again.
    """
    mine = HumanRequest.objects.filter(saga=saga, addressee__user=user).select_related("asker")
    waiting, answered = open_and_done(
        mine, [HumanRequest.Status.PENDING], [HumanRequest.Status.ANSWERED], open_by="created_at",
        done_by="answered_at", open_limit=None, done_limit=20,
    )  # fmt: skip
    pending = []
    for human_request in waiting:
        values, problems = (bound or {}).get(human_request.pk, ({}, {}))
        fields = [
            BoundField(
                name=f["name"], label=f["label"], type=f["type"], required=f["required"], choices=list(f["choices"]),
                value=values.get(f["name"]), errors=list(problems.get(f["name"], [])),
            )
            for f in human_request.fields
        ]  # fmt: skip
        known = {f.name for f in fields}
        general = [msg for name, msgs in problems.items() if name not in known for msg in msgs]
        pending.append(InboxForm(human_request=human_request, fields=fields, errors=general))
    return pending, answered


def addressed_form(saga: Saga, user: Any, human_request_id: str) -> HumanRequest | None:
    """A form of this saga addressed to user, or None: nobody else can even find it here."""
    return HumanRequest.objects.filter(saga=saga, addressee__user=user, pk=human_request_id).first()


def answer_from_post(human_request: HumanRequest, data: Any) -> dict[str, Any]:
    """The submitted values of a form's own fields (a multichoice is a list); nothing else. Each
    input is named `field.<name>` on the page, so that no field's name meets the page's own
    inputs (a field named `csrfmiddlewaretoken` would be posted twice, and refused)."""
    answer: dict[str, Any] = {}
    for f in human_request.fields:
        if f["type"] == "multichoice":
            answer[f["name"]] = data.getlist(f"field.{f['name']}")
        else:
            answer[f["name"]] = data.get(f"field.{f['name']}")
    return answer


# --- workers -----------------------------------------------------------------------------------


@dataclass
class Worker:
    """One agent worker's lifecycle, from its worker_start to its worker_end."""

    key: str
    actor: str
    run_id: str
    role: str
    goal: str
    started_at: datetime
    phase: str = ""
    status: str = "running"
    ended_at: datetime | None = None
    model: str = ""
    llm_calls: int = 0
    tokens: int = 0
    fallbacks: int = 0
    summary: str = ""
    error: str = ""

    @property
    def duration_s(self) -> float | None:
        return (self.ended_at - self.started_at).total_seconds() if self.ended_at else None


def workers(saga: Saga, lens: JournalLens, *, limit: int = 2000) -> list[Worker]:
    """Workers in the order they started, built from the lifecycle events the viewer may see."""
    events = JournalEvent.objects.filter(saga=saga, type__in=WORKER_EVENTS).order_by("-seq")[:limit]
    by_key: dict[str, Worker] = {}
    current: dict[str, str] = {}  # run (or actor) → key of its latest worker
    for event in reversed(lens.visible(list(events))):
        data = event.data if isinstance(event.data, dict) else {}
        run = event.run_id or event.actor
        if event.type == "worker_start":
            key = f"{run}#{event.seq}"
            current[run] = key
            by_key[key] = Worker(
                key=key, actor=event.actor, run_id=event.run_id, role=str(data.get("role") or ""),
                goal=str(data.get("goal") or data.get("task") or ""), phase=str(data.get("phase") or ""),
                model=str(data.get("model") or data.get("modelId") or ""), started_at=event.created_at,
            )  # fmt: skip
            continue
        worker = by_key.get(current.get(run, ""))
        if worker is None:
            continue
        if event.type == "llm_call":
            worker.llm_calls += 1
            worker.model = str(data.get("model") or worker.model)
            worker.tokens += int(data.get("prompt_tokens") or 0) + int(data.get("completion_tokens") or 0)
        elif event.type == "model_fallback":
            worker.fallbacks += 1
        elif event.type == "worker_end":
            worker.status = str(data.get("status") or "completed")
            worker.ended_at = event.created_at
            worker.summary = short(data.get("summary") or data.get("result") or "")
            worker.error = short(data.get("error") or "")
    found = list(by_key.values())
    # A worker without its worker_end is as busy as its run: working, resting idle, or waiting.
    open_runs = {w.run_id for w in found if w.ended_at is None and w.run_id}
    statuses = dict(Run.objects.filter(pk__in=open_runs).values_list("pk", "status"))
    for worker in found:
        if worker.ended_at is None and statuses.get(worker.run_id) in (Run.Status.IDLE, Run.Status.WAITING):
            worker.status = statuses[worker.run_id]
    return found


# --- the journal -------------------------------------------------------------------------------


def events_page(
    saga: Saga, lens: JournalLens, *, before: int | None = None, limit: int = PAGE_SIZE
) -> tuple[list[JournalEvent], bool]:
    """The newest events the viewer may see (before seq `before`), newest first, and whether older
    ones remain."""
    events = JournalEvent.objects.filter(saga=saga)
    if before is not None:
        events = events.filter(seq__lt=before)
    return lens.take(events, limit, newest_first=True)


def events_after(
    saga: Saga, lens: JournalLens, after: int, *, limit: int = FETCH_LIMIT
) -> tuple[list[JournalEvent], bool]:
    """The events after seq `after` the viewer may see, oldest first, and whether more follow."""
    return lens.take(JournalEvent.objects.for_saga(saga.pk, after=after), limit)


def short(value: Any, limit: int = 160) -> str:
    """A one-line rendering of any JSON value, cut to limit characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(event: JournalEvent) -> str:
    """One readable line for an event; unknown types fall back to their data."""
    d: dict[str, Any] = event.data if isinstance(event.data, dict) else {"value": event.data}
    kind = event.type
    if kind == "saga.created":
        return f"created the saga “{d.get('title', '')}” ({d.get('policy', '')} policy)"
    if kind == "collaborator.joined":
        text = f"added {d.get('id')}" + (f" as {d['role']}" if d.get("role") else "")
        if d.get("parent"):
            text += f" under {d['parent']}"
        if d.get("runtime"):
            text += f" · {d['runtime']}" + (f" ({d['profile']})" if d.get("profile") else "")
        return text
    if kind == "request.created":
        return f"asked {d.get('to')} · {d.get('type')} · {d.get('mode', 'async')}"
    if kind == "request.delivered":
        return f"received {d.get('request_id')}"
    if kind in ("request.completed", "request.failed"):
        verb = "answered" if kind == "request.completed" else "failed"
        text = f"{d.get('to')} {verb} {d.get('from')}'s {d.get('request_id')}"
        detail = d.get("error") if kind == "request.failed" else d.get("payload")
        return text + (f": {short(detail, 120)}" if detail not in (None, "", {}) else "")
    if kind.startswith("request."):
        status = kind.partition(".")[2].replace("_", " ")
        return f"{d.get('request_id')} {status}" + (f" ({d['from']} → {d['to']})" if d.get("from") else "")
    if kind.startswith("run."):
        text = f"run {kind.partition('.')[2]}"
        if d.get("turn"):
            text += f" after turn {d['turn']}"
        if d.get("request_id") or d.get("remote_call_id"):
            text += f" on {d.get('request_id') or d.get('remote_call_id')}"
        if d.get("error"):
            text += f": {short(d['error'], 120)}"
        return text
    if kind == "remote_request":
        return f"called remote agent {d.get('remote')} · {d.get('mode')} · {d.get('call_id')}"
    if kind == "remote_reply":
        failed = d.get("status") == "failed"
        detail = d.get("error") if failed else d.get("reply")
        return f"{d.get('remote')} {'failed' if failed else 'answered'} {d.get('call_id')}: {short(detail, 120)}"
    if kind.startswith("remote_agent."):
        return f"{kind.partition('.')[2]} remote agent {d.get('remote')}" + (f" at {d['url']}" if d.get("url") else "")
    if kind == "steering.message":
        return f"sent a message to {d.get('to')}"
    if kind == "team.spawned":
        return f"spawned teammate {d.get('teammate')} ({d.get('role') or d.get('profile')}) for {d.get('lead')}"
    if kind == "team.broadcast":
        return f"broadcast to {len(d.get('recipients') or [])} teammates: {short(d.get('content'), 120)}"
    if kind == "team.configured":
        return f"set {d.get('lead')}'s team budgets: {d.get('max_teammates')} teammates, {d.get('max_tokens')} tokens"
    if kind == "human_request.created":
        return f"asked {d.get('to')}: “{d.get('title', '')}”"
    if kind == "saga.finished":
        return f"finished the saga: {d.get('status')}" + (f" · {short(d['reason'], 120)}" if d.get("reason") else "")
    if kind == "human_request.cancelled":
        return f"withdrew {d.get('human_request_id')}"
    if kind == "human_request.answered":
        return f"answered {d.get('human_request_id')}: {short(d.get('answer'), 120)}"
    if kind == "worker_start":
        return f"worker started · {d.get('role', '')}" + (f" · {short(d['task'], 100)}" if d.get("task") else "")
    if kind == "worker_end":
        return f"worker {d.get('status', 'ended')}" + (f": {short(d['error'], 120)}" if d.get("error") else "")
    if kind == "llm_call":
        tokens = int(d.get("prompt_tokens") or 0) + int(d.get("completion_tokens") or 0)
        tools = ", ".join(d.get("tool_calls") or [])
        return f"called {d.get('model')}" + (f" · {tokens} tokens" if tokens else "") + (f" → {tools}" if tools else "")
    if kind == "model_fallback":
        return f"{d.get('model')} failed ({d.get('error_class', 'error')}); trying the next model"
    return short(d, 140) if d else ""


def event_tone(event_type: str) -> str:
    """A colour family for an event type, for the timeline's markers."""
    if event_type.endswith(("failed", "expired", "recipient_unavailable", "cancelled", "fallback")):
        return "red"
    head = event_type.partition(".")[0].partition("_")[0]
    return {
        "saga": "indigo",
        "collaborator": "blue",
        "request": "violet",
        "run": "teal",
        "steering": "amber",
        "human": "pink",
        "worker": "green",
        "team": "amber",
    }.get(head, "grey")


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def latest_seq(events: Iterable[JournalEvent]) -> int:
    return max((e.seq for e in events), default=0)


# --- persistent teams: roster and lead inbox ---------------------------------------------------


@dataclass(frozen=True)
class TeamView:
    team: TeamModel
    teammates: list[Teammate]
    inbox: list[SteeringItem] | None  # None: not the viewer's to read
    unread: int

    @property
    def at_work(self) -> int:
        return sum(1 for m in self.teammates if m.status != "shutdown")

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.teammates)


def teams(saga: Saga, viewer: Any, *, inbox_limit: int = 20) -> list[TeamView]:
    """Each team of the saga with its roster and, for the saga's managers and the lead, the lead's
    inbox (what teammates sent it: requests, which anyone else sees only as a party to them)."""
    views, manager = [], may_manage(viewer, saga)
    for found in TeamModel.objects.filter(saga=saga).select_related("lead", "saga").order_by("created_at"):
        if manager or found.lead.user_id == viewer.pk:
            inbox, unread = lead_inbox(found, limit=inbox_limit)
        else:
            inbox, unread = None, 0
        views.append(TeamView(team=found, teammates=roster(found), inbox=inbox, unread=unread))
    return views
