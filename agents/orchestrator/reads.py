"""What the orchestration's steps read: a prompt with all a step needs of it, and how its
workers ended; read by the step itself or, on PostgreSQL, ahead of it, by the transaction that
ends a worker's task (prompts_ahead())."""

from collections.abc import Callable
from typing import Any

from django.db import connection
from django.db.models import Model

from accounts.models import User
from agents.hooks import Event
from agents.hooks.models import handled_sql
from agents.models import AgentProfile, TranscriptEntry
from agents.orchestrator.models import Brain, Prompt
from config.sql import columns, db_value, fetch, fetch_later, placeholders, prepared
from sagas.access import SagaTree
from sagas.models import AgentRequest, Collaborator, HumanRequest, Run, Saga
from sagas.remotes import RemoteCall

# Prompts as a step reads them, with the brain, the saga, the lead with its user and its run (which
# the last step ends), who submitted it, and which lifecycle events the brain has handlers for
# (every step runs some, most often to find none): written out (the ORM's select_related costs
# more to build than to run).
_PROMPTS = (
    f"SELECT {columns(Prompt, 'p')}, {columns(Brain, 'b')}, {columns(Saga, 's')}, {columns(Collaborator, 'l')}, "
    f"{columns(User, 'u')}, {columns(Run, 'lr')}, {columns(User, 'sb')}, "
    f"{', '.join(handled_sql(event, brain='b.name') for event in Event)} "
    f"FROM {Prompt._meta.db_table} p JOIN {Brain._meta.db_table} b ON b.id = p.brain_id "
    f"JOIN {Saga._meta.db_table} s ON s.id = p.saga_id LEFT JOIN {Collaborator._meta.db_table} l ON l.id = p.lead_id "
    f"LEFT JOIN {User._meta.db_table} u ON u.id = l.user_id "
    f"LEFT JOIN {Run._meta.db_table} lr ON lr.collaborator_id = l.id "
    f"JOIN {User._meta.db_table} sb ON sb.id = p.submitted_by_id "
)
_PROMPT_SQL = _PROMPTS + "WHERE p.id = %s"
_RUNNING_PROMPTS_SQL = _PROMPTS + "WHERE p.saga_id = %s AND l.name = %s AND p.status = %s"


_PROMPT_SHAPE = (Prompt, Brain, Saga, Collaborator, User, Run, User)


def read_prompts(sql: str, params: list[Any]) -> list[Prompt]:
    return loaded_prompts(fetch(sql, params, *_PROMPT_SHAPE))


def loaded_prompts(rows: list[list[Any]]) -> list[Prompt]:
    found = []
    for prompt, brain, saga, lead, user, run, prompt.submitted_by, *handled in rows:
        prompt.brain, prompt.saga, prompt.lead = brain, saga, lead
        prompt.hooked_events = frozenset(event for event, yes in zip(Event, handled, strict=True) if yes)
        if lead is not None:
            lead.user = user
        if run is not None:
            lead.run = run  # and run.collaborator = lead
        found.append(prompt)
    return found


def read_prompt(prompt_id: str) -> Prompt | None:
    return next(iter(read_prompts(_PROMPT_SQL, [db_value(Prompt, "id", prompt_id)])), None)


def running_prompts(saga_id: str, lead: str) -> list[Prompt]:
    """The running prompts of the lead named `lead` in this saga."""
    return read_prompts(_RUNNING_PROMPTS_SQL, [db_value(Saga, "id", saga_id), lead, Prompt.Status.RUNNING])


def prompts_ahead(saga_id: Any, lead: str) -> Callable[[], list[Prompt]]:
    """running_prompts(), each with the runs of the lead's workers (`runs_read`, which outcomes()
    takes in place of a read of its own) and, on PostgreSQL, its primary role's profile
    (`profiles_read`, for primary_mcp()), read with the next statement or the COMMIT of the
    caller's transaction (config.sql.fetch_later): a prompt's worker reads them in the transaction
    that ends its task, for the step its ending may have made ready (agents.turns)."""
    saga_param = db_value(Saga, "id", saga_id)
    prompts = fetch_later(_RUNNING_PROMPTS_SQL, [saga_param, lead, Prompt.Status.RUNNING], *_PROMPT_SHAPE)
    runs = fetch_later(_LEAD_RUNS_SQL, [saga_param, f"{lead}.%"], Run, Collaborator)
    profiles = None
    if connection.vendor == "postgresql":  # elsewhere a read costs no round trip: primary_mcp() reads it
        profiles = fetch_later(_PRIMARY_PROFILES_SQL, [saga_param, lead, Prompt.Status.RUNNING], AgentProfile)

    def read() -> list[Prompt]:
        found = loaded_prompts(prompts())
        primaries = profiles() if profiles is not None else None
        for prompt in found:
            prompt.runs_read = runs()
            if primaries is not None:
                prompt.profiles_read = {p.name: p for p, prompt_id in primaries if str(prompt_id) == str(prompt.pk)}
        return found

    return read


class Outcome:
    """How a delegated worker ended: its output, or the error of a failed run."""

    def __init__(self, run: Run | None, *, output: Any = None, error: str = "", failed: bool = False) -> None:
        self.run, self.output, self.error, self.failed = run, output, error, failed

    @property
    def blocked(self) -> bool:
        """Failed because its SubagentStart hook blocked it (the executor's `start_hooks`)."""
        return self.failed and (
            self.run is None or (isinstance(self.run.result, dict) and "blocked" in self.run.result)
        )


def outcomes(prompt: Prompt, slots: list[str]) -> dict[str, Outcome]:
    """How the workers of these slots ended, read in one statement; a slot whose worker is still at
    it (or, unexpectedly, missing: the step that moved here created it) is absent. A run that went
    idle after answering in text (a model that never calls finish) is done, its last text its
    output, unless something it asked (of an agent, a person or a remote agent) is still open: its
    answer wakes the run, whose next rest rings the orchestration again."""
    names = {prompt.worker_name(slot): slot for slot in slots}
    found: dict[str, Outcome] = {}
    if not names:
        return found
    rows = prompt.runs_read
    if rows is None:
        rows = fetch(_RUNS_SQL.format(ids=placeholders(len(names))), [db_value(Saga, "id", prompt.saga_id), *names],
                     Run, Collaborator)  # fmt: skip
    for run, collaborator, awaiting in rows:
        if collaborator.name not in names:
            continue
        run.collaborator = collaborator
        slot = names[collaborator.name]
        if run.status == Run.Status.COMPLETED:
            found[slot] = Outcome(run, output=run.result)
        elif run.status in Run.FINISHED:
            found[slot] = Outcome(run, error=run.error or f"The worker's run was {run.status}.", failed=True)
        elif run.status == Run.Status.IDLE and not awaiting:
            found[slot] = Outcome(run, output=last_text(run))
    return found


def asks_open(collaborator: str) -> str:
    """SQL: whether the collaborator whose id is the column `collaborator` waits on the answer to
    something it asked (of an agent, a person or a remote agent). A prompt's worker cannot ask its
    lead, which answers none (agents.tools.ask_agent)."""

    def any_open(model: type[Model], asker: str, statuses: tuple[str, ...]) -> str:
        listed = ", ".join(f"'{status}'" for status in statuses)
        return f"EXISTS (SELECT 1 FROM {model._meta.db_table} WHERE {asker} = {collaborator} AND status IN ({listed}))"

    return (
        f"({any_open(AgentRequest, 'sender_id', AgentRequest.OPEN)} "
        f"OR {any_open(HumanRequest, 'asker_id', (HumanRequest.Status.PENDING,))} "
        f"OR {any_open(RemoteCall, 'caller_id', RemoteCall.OPEN)})"
    )


_AWAITING = f"CASE WHEN r.status = '{Run.Status.IDLE}' THEN {asks_open('c.id')} ELSE false END"  # idle ones only
_RUNS = (
    f"SELECT {columns(Run, 'r')}, {columns(Collaborator, 'c')}, {_AWAITING} FROM {Run._meta.db_table} r "
    f"JOIN {Collaborator._meta.db_table} c ON c.id = r.collaborator_id "
)
_RUNS_SQL = _RUNS + "WHERE c.saga_id = %s AND c.name IN ({ids})"
_LEAD_RUNS_SQL = prepared(_RUNS + "WHERE c.saga_id = %s AND c.name LIKE %s")  # the lead's workers: `lead.%`
# The profile of each running prompt's primary role (PostgreSQL's JSON operators), with the prompt's id.
_PRIMARY_PROFILES_SQL = prepared(
    f"SELECT {columns(AgentProfile, 'ap')}, p.id FROM {Prompt._meta.db_table} p "
    f"JOIN {Brain._meta.db_table} b ON b.id = p.brain_id JOIN {Collaborator._meta.db_table} l ON l.id = p.lead_id "
    f"JOIN {AgentProfile._meta.db_table} ap ON ap.name = b.roles ->> (p.plan ->> 'primary_role') "
    "WHERE p.saga_id = %s AND l.name = %s AND p.status = %s"
)


def last_text(run: Run) -> str:
    for entry in TranscriptEntry.objects.filter(run=run).order_by("-seq").only("message")[:20]:
        if entry.message.get("role") == "assistant" and entry.message.get("content"):
            return str(entry.message["content"])
    return ""


def at_work_under(prompt: Prompt) -> list[Run]:
    """The runs still at work among the lead's delegates and theirs, oldest first."""
    if prompt.lead_id is None:
        return []
    under = SagaTree.shape(prompt.saga).descendants(prompt.lead_id)
    at_work = Run.objects.filter(collaborator_id__in=under).exclude(status__in=Run.FINISHED)
    return list(at_work.select_related("collaborator").order_by("created_at", "pk"))
