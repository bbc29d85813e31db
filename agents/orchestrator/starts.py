"""SubagentStart, in each support worker's own task, before its first model call.

The routing step only plans and delegates; each support worker's first task (the routing task
itself for the first one, a Celery worker each for the others) runs the worker's SubagentStart
handlers once its run is claimed, outside any transaction (a handler may take its whole timeout;
the heartbeat keeps the run's lease). So the workers' hooks run side by side, as the workers do.

A block fails that worker only, with the reason, before any model call; added context is appended
to its task. The run is keyed like every hook run (`hook_key`): a worker killed mid-hook is claimed
again and finds its finished handlers stored.
"""

from dataclasses import dataclass
from typing import Any

from django.db import connection

from agents.hooks import Event, hook_key, run_hooks
from agents.hooks.models import HookHandler
from agents.orchestrator.models import Brain, Prompt
from config.sql import db_value, prepared, py_value
from sagas.models import Collaborator


@dataclass(frozen=True)
class Pending:
    """A support worker whose SubagentStart has handlers to run (or stored, from a try cut short)."""

    saga_id: Any
    prompt_id: str
    brain: str
    role: str
    goal: str
    prompt: str


@dataclass(frozen=True)
class Start:
    """What its handlers decided."""

    blocked: str = ""  # the reason, when one blocked it
    context: str = ""


def pending_start(saga_id: Any, name: str) -> Pending | None:
    """The SubagentStart to run for the run of `name` (`brain-….role`), or None: not a prompt's
    support worker (the primary, the reviewer), or no handler of its brain for that event."""
    lead, _, slot = name.partition(".")
    with connection.cursor() as cursor:
        cursor.execute(_PENDING_SQL, [Event.SUBAGENT_START.value, True, db_value(Prompt, "saga", saga_id), lead])
        row = cursor.fetchone()
    if row is None:
        return None
    prompt_id, plan, expanded, text, brain, handled = row
    plan = py_value(Prompt, "plan", plan) or {}
    worker = next((w for w in plan.get("workers", []) if w.get("role") == slot), None)
    if worker is None or not handled:
        return None
    return Pending(
        saga_id=saga_id, prompt_id=str(py_value(Prompt, "id", prompt_id)), brain=brain, role=slot,
        goal=str(worker.get("goal", "")), prompt=expanded or text,
    )  # fmt: skip


# The prompt a worker's lead runs, and whether its brain has a SubagentStart handler (handlers_for()),
# in one plain statement: every support worker's first turn asks.
_PENDING_SQL = prepared(
    f"SELECT p.id, p.plan, p.expanded, p.text, b.name, EXISTS (SELECT 1 FROM {HookHandler._meta.db_table} h "
    "WHERE h.event = %s AND h.trusted = %s AND (h.brain = '' OR h.brain = b.name)) "
    f"FROM {Prompt._meta.db_table} p JOIN {Brain._meta.db_table} b ON b.id = p.brain_id "
    f"JOIN {Collaborator._meta.db_table} c ON c.id = p.lead_id WHERE p.saga_id = %s AND c.name = %s"
)


def run_start(pending: Pending) -> Start:
    """Run its handlers (never inside a transaction: they may take their whole timeout)."""
    outcome = run_hooks(
        saga_id=pending.saga_id, event=Event.SUBAGENT_START, brain=pending.brain, role=pending.role,
        key=hook_key(pending.prompt_id, Event.SUBAGENT_START, pending.role),
        payload={"prompt_id": pending.prompt_id, "goal": pending.goal, "prompt": pending.prompt},
    )  # fmt: skip
    if outcome.blocked:
        return Start(blocked=outcome.reason or f"Blocked by the SubagentStart hook {outcome.blocked_by}.")
    return Start(context=outcome.context)
