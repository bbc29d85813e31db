"""Teams: a lead's persistent teammates. A teammate is a delegation of its lead whose run is marked
with the team: it idles between tasks instead of finishing, wakes on steering, and ends only by a
shutdown (terminal, never woken again). Only the lead or a manager of the saga broadcasts to the
team or shuts a teammate down."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string

from accounts.models import User
from config.sql import defer, prepared
from journal.actions import record
from sagas import errors
from sagas.access import may_manage
from sagas.actions.collaborators import actor_id, add_agent, find_collaborator
from sagas.actions.locking import lock_open_saga, lock_saga
from sagas.actions.payloads import body_hash, caller_key, check_payload, first_for_key
from sagas.actions.runs import end_run
from sagas.actions.steering import check_backlog, push_steering
from sagas.models import AgentRequest, Broadcast, Collaborator, Run, Saga, SteeringItem, Team


def tokens_used(run_ids: list[str]) -> dict[str, int]:
    """Tokens by run, from the runtime that counts them (`AGORA_RUN_TOKENS`)."""
    if not run_ids:
        return {}
    return dict(import_string(settings.AGORA_RUN_TOKENS)(run_ids))


def count_team_tokens(*, team_id: int, tokens: int) -> None:
    """A teammate's turn adds the tokens its model calls used to its team's total, in the
    transaction that stores them in its transcript; nothing waits for it (config.sql.defer). A
    budget check then reads one row, however long the team's history."""
    if tokens:
        defer(_COUNT_TOKENS_SQL, [tokens, team_id])


_COUNT_TOKENS_SQL = prepared(f"UPDATE {Team._meta.db_table} SET tokens_used = tokens_used + %s WHERE id = %s")


def check_lead(team: Team, by: User) -> None:
    if team.lead.user_id != by.pk and not may_manage(by, team.saga):
        raise errors.NotTeamLead(f"Only {team.lead.handle} or a manager of the saga directs this team.")


def team_of(saga: Saga, lead: str) -> Team:
    team = Team.objects.select_related("lead", "saga").filter(saga=saga, lead__kind="agent", lead__name=lead_name(lead))
    found = team.first()
    if found is None:
        raise errors.NotFound(f"{lead} leads no team in this saga.")
    return found


def lead_name(handle: str) -> str:
    kind, _, name = handle.partition(":")
    return name if kind == Collaborator.Kind.AGENT else ""


def visible_team(saga: Saga, lead: str, by: User) -> Team:
    """The team, for its lead, its teammates and the saga's managers; to anyone else it does not exist."""
    team = team_of(saga, lead)
    if team.lead.user_id == by.pk or may_manage(by, saga):
        return team
    if Run.objects.filter(team=team, collaborator__user=by).exists():
        return team
    raise errors.NotFound(f"{lead} leads no team in this saga.")


def new_team(saga: Saga, lead: Collaborator) -> Team:
    """The lead's team, created with the configured default budgets the first time it is needed."""
    team = Team.objects.filter(lead=lead).select_related("lead", "saga").first()
    if team is not None:
        return team
    return Team.objects.create(
        saga=saga, lead=lead, max_teammates=settings.AGORA_TEAM_MAX_TEAMMATES,
        max_tokens=settings.AGORA_TEAM_MAX_TOKENS, idle_timeout_s=settings.AGORA_TEAM_IDLE_TIMEOUT_S,
    )  # fmt: skip


BUDGETS = ("max_teammates", "max_tokens", "idle_timeout_s")
# The largest each may be: what its column holds, and for the idle timeout ten years (a deadline
# computed from it stays a date; 0 already says "never").
BUDGET_MAX: dict[str, int] = {"max_teammates": 2**31 - 1, "max_tokens": 2**63 - 1, "idle_timeout_s": 10 * 366 * 86400}


@transaction.atomic
def configure_team(*, lead: Collaborator, by: User, **budgets: float | None) -> Team:
    """A manager sets a team's budgets (before its first spawn too); a lead cannot raise its own."""
    saga = lock_saga(lead.saga_id)
    if not may_manage(by, saga):
        raise errors.Forbidden("Only managers of the saga set a team's budgets.")
    if not lead.is_agent:
        raise errors.InvalidPayload("A team's lead is an agent.", errors={"lead": ["Not an agent."]})
    if unknown := set(budgets) - set(BUDGETS):
        raise errors.InvalidPayload("Unknown budget.", errors={name: ["Unknown."] for name in sorted(unknown)})
    changes = {name: value for name, value in budgets.items() if value is not None}
    if bad := [name for name, value in changes.items() if not 0 <= value <= BUDGET_MAX[name]]:
        raise errors.InvalidPayload(
            "A budget is out of range.", errors={name: [f"From 0 to {BUDGET_MAX[name]:g}."] for name in bad}
        )
    team = new_team(saga, lead)
    for name, value in changes.items():
        setattr(team, name, value if name == "idle_timeout_s" else int(value))
    if changes:  # only the budgets: `tokens_used` is the teammates' turns' to add to
        team.save(update_fields=[*changes])
    record(
        saga_id=saga.pk,
        type="team.configured",
        actor=actor_id(saga, by),
        data={"lead": lead.handle, **{name: getattr(team, name) for name in BUDGETS}},
    )
    return team


@transaction.atomic
def spawn_teammate(
    *, lead: Collaborator, name: str, role: str, prompt: str, profile: str, by: User, idempotency_key: str = ""
) -> tuple[Collaborator, bool]:
    """A persistent internal teammate under `lead`; returns it and whether it is new. Refused past
    the team's cap on teammates at work (`team_full`) or on tokens (`team_budget_exhausted`), and
    for a lead that is itself a teammate (`not_team_lead`): teams do not nest."""
    saga = lock_open_saga(lead.saga_id)
    if not lead.is_agent:
        raise errors.InvalidPayload("A team's lead is an agent.", errors={"lead": ["Not an agent."]})
    if lead.user_id != by.pk and not may_manage(by, saga):
        raise errors.NotTeamLead(f"Only {lead.handle} or a manager of the saga spawns its teammates.")
    if Run.objects.filter(collaborator=lead, team__isnull=False).exists():  # its team's caps would not hold
        raise errors.NotTeamLead(f"{lead.handle} is a teammate: a team has one lead, and teammates lead none.")
    key = caller_key(by.pk, idempotency_key)  # the lead's and a manager's never meet
    team = Team.objects.filter(lead=lead).select_related("lead", "saga").first()
    if team is not None and key:
        first = Run.objects.filter(team=team, spawn_key=key).select_related("collaborator").first()
        if first is not None:
            mate = first.collaborator
            if (mate.name, mate.role, mate.task, mate.profile) != (name, role, prompt, profile):
                raise errors.IdempotencyConflict("This Idempotency-Key was already used for a different teammate.")
            return mate, False
    team = team or new_team(saga, lead)
    runs = list(Run.objects.filter(team=team).values_list("pk", "status"))
    at_work = sum(1 for _, status in runs if status not in Run.FINISHED)
    if at_work >= team.max_teammates:
        cap = team.max_teammates
        raise errors.TeamFull(f"{lead.handle}'s team already has {at_work} teammates at work (cap {cap}).")
    if team.tokens_used >= team.max_tokens:
        used, budget = team.tokens_used, team.max_tokens
        raise errors.TeamBudgetExhausted(f"{lead.handle}'s team used {used} of its {budget} tokens.")
    mate, _ = add_agent(
        saga=saga, name=name, role=role, task=prompt, runtime=Collaborator.Runtime.INTERNAL, profile=profile,
        parent=lead.handle, by=by,
    )  # fmt: skip
    Run.objects.filter(collaborator=mate).update(team=team, spawn_key=key, resumable=False)
    mate.run.team, mate.run.spawn_key, mate.run.resumable = team, key, False
    record(
        saga_id=saga.pk,
        type="team.spawned",
        actor=actor_id(saga, by),
        run_id=mate.run.pk,
        data={"lead": lead.handle, "teammate": mate.handle, "role": role, "profile": profile},
    )
    return mate, True


@transaction.atomic
def broadcast(*, lead: Collaborator, content: Any, by: User, idempotency_key: str = "") -> tuple[Broadcast, bool]:
    """One steering item to every teammate at work, all in this one transaction, journaled once
    with its recipients. Returns the broadcast and whether it is new (a replayed key is not)."""
    saga = lock_open_saga(lead.saga_id)
    team = Team.objects.select_related("lead", "saga").filter(lead=lead).first()
    if team is None:
        raise errors.NotFound(f"{lead.handle} leads no team in this saga.")
    check_lead(team, by)
    if content is None or content == "":
        raise errors.InvalidPayload("A broadcast needs content.", errors={"content": ["This field is required."]})
    check_payload(content, field="content")
    sender = actor_id(saga, by)
    digest = body_hash(content=content)
    if idempotency_key and (
        first := first_for_key(
            Broadcast.objects.filter(team=team, sender=sender, idempotency_key=idempotency_key), digest,
            conflict="This Idempotency-Key was already used for a different broadcast.",
        )
    ):  # fmt: skip
        return first, False
    mates = list(
        Collaborator.objects.filter(run__team=team)
        .exclude(run__status__in=Run.FINISHED)
        .select_related("run")
        .order_by("joined_at", "pk")
    )
    for mate in mates:
        check_backlog(mate)
    sent = Broadcast.objects.create(
        team=team, sender=sender, content=content, recipients=[m.handle for m in mates],
        idempotency_key=idempotency_key, body_hash=digest,
    )  # fmt: skip
    for mate in mates:
        push_steering(recipient=mate, kind=SteeringItem.Kind.MESSAGE, sender=sender, broadcast=sent, payload=content)
    record(
        saga_id=saga.pk,
        type="team.broadcast",
        actor=sender,
        data={"broadcast_id": sent.pk, "lead": lead.handle, "recipients": sent.recipients, "content": content},
    )
    return sent, True


@transaction.atomic
def shutdown_teammate(*, teammate: Collaborator, reason: str, by: User) -> Run:
    """End a teammate for good: its pending inbound requests fail with `recipient_unavailable`, its
    open outbound requests and forms are cancelled, and it never wakes again. Shutting down a
    teammate that has already ended changes nothing."""
    lock_saga(teammate.saga_id)
    run = Run.objects.select_related("collaborator", "team__lead", "team__saga").filter(collaborator=teammate).first()
    if run is None or run.team is None:
        raise errors.NotFound(f"{teammate.handle} is not a teammate.")
    check_lead(run.team, by)
    end_teammate(run, reason=reason, actor=actor_id(run.team.saga, by))
    run.refresh_from_db()
    return run


def end_teammate(run: Run, *, reason: str, actor: str) -> bool:
    """In the caller's transaction, under the saga lock: end_run() with `shutdown`, for good."""
    if not end_run(run=run, status=Run.Status.SHUTDOWN, reason=reason, actor=actor):
        return False
    Run.objects.filter(pk=run.pk).update(resumable=False)
    return True


def stop_over_budget(*, run: Run, used: int, budget: int) -> bool:
    """A teammate's turn found its team's tokens spent (`used` of `budget`, as the runtime counts
    them): it is shut down before its model is called, with the reason `team_budget_exhausted`
    (journaled in `run.shutdown`, shown in the roster). In the turn's transaction."""
    reason = f"{errors.TeamBudgetExhausted.code}: the team used {used} of its {budget} tokens."
    return end_teammate(run, reason=reason, actor="system")


def shut_down_idle(*, run_id: str, now: datetime) -> bool:
    """The reconciler's idle timeout: a teammate still idle past its team's `idle_timeout_s` is
    shut down (journaled as `run.shutdown` by `system`). A steering item that woke it first wins."""
    with transaction.atomic():
        saga_id = Run.objects.filter(pk=run_id).values_list("collaborator__saga_id", flat=True).first()
        if saga_id is None:
            return False
        lock_saga(saga_id)
        run = Run.objects.select_related("collaborator", "team").filter(pk=run_id, status=Run.Status.IDLE).first()
        if run is None or run.team is None or run.team.idle_timeout_s <= 0:
            return False
        if run.updated_at + timedelta(seconds=run.team.idle_timeout_s) > now:
            return False
        return end_teammate(run, reason=f"Idle for more than {run.team.idle_timeout_s:g} s.", actor="system")


def idle_teammate_ids(now: datetime) -> list[str]:
    """Idle teammates past their team's idle timeout, oldest first (shut_down_idle() checks again
    under the lock). Each team has its own timeout: compared here rather than in portable SQL."""
    idle = Run.objects.filter(team__isnull=False, team__idle_timeout_s__gt=0, status=Run.Status.IDLE)
    rows = idle.order_by("updated_at").values_list("pk", "updated_at", "team__idle_timeout_s")[:2000]
    return [pk for pk, since, timeout in rows if since + timedelta(seconds=timeout) <= now][:500]


@transaction.atomic
def shutdown_team(*, team: Team, reason: str, actor: str = "system") -> int:
    """Every teammate at work shut down, oldest first (a finished saga ends its teams, an ended lead
    its own); returns how many."""
    lock_saga(team.saga_id)
    runs = Run.objects.filter(team=team).exclude(status__in=Run.FINISHED).select_related("collaborator")
    return sum(end_teammate(run, reason=reason, actor=actor) for run in runs.order_by("created_at", "pk"))


@dataclass(frozen=True)
class Teammate:
    id: str
    role: str
    status: str
    run_status: str
    run_id: str
    current_task: str
    turns: int
    tokens: int
    last_activity: datetime
    reason: str  # why it was shut down


def roster(team: Team) -> list[Teammate]:
    """Each teammate with what it is doing: its open request being worked on, else its prompt."""
    runs = list(Run.objects.filter(team=team).select_related("collaborator").order_by("created_at", "pk"))
    tokens = tokens_used([r.pk for r in runs])
    working_on: dict[int, str] = {}
    delivered = AgentRequest.objects.filter(
        recipient__run__team=team, status=AgentRequest.Status.DELIVERED
    ).select_related("sender")
    for request in delivered.order_by("created_at"):
        working_on[request.recipient_id] = f"{request.type} from {request.sender.handle}"
    return [
        Teammate(
            id=run.collaborator.handle,
            role=run.collaborator.role,
            status=run.team_status,
            run_status=run.status,
            run_id=run.pk,
            current_task="" if run.is_finished else working_on.get(run.collaborator_id, run.collaborator.task),
            turns=run.turn,
            tokens=tokens.get(run.pk, 0),
            last_activity=run.updated_at,
            reason=run.error if run.is_finished else "",
        )
        for run in runs
    ]


def lead_inbox(team: Team, *, limit: int = 200) -> tuple[list[SteeringItem], int]:
    """What teammates sent the lead, newest first, and how many of those it has not read yet
    (read: injected into one of its turns, or acknowledged on its steering feed)."""
    senders = [c.handle for c in Collaborator.objects.filter(run__team=team)]
    items = SteeringItem.objects.filter(recipient=team.lead, sender__in=senders).select_related("request")
    unread = items.filter(consumed_at__isnull=True).count()
    return list(items.order_by("-seq")[:limit]), unread


def find_teammate(team: Team, handle: str) -> Collaborator:
    mate = find_collaborator(team.saga, handle)
    if mate is None or not Run.objects.filter(collaborator=mate, team=team).exists():
        raise errors.NotFound(f"No teammate {handle} in {team.lead.handle}'s team.")
    return mate
