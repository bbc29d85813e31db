"""SubagentStart, in each support worker's own task, before its first model call.

The routing step only plans and delegates; each support worker's first task (the routing task
itself for the first one, a Celery worker each for the others) runs the worker's SubagentStart
handlers once its run is claimed, outside any transaction (a handler may take its whole timeout;
the heartbeat keeps the run's lease). So the workers' hooks run side by side, as the workers do.

A block fails that worker only, with the reason, before any model call; added context is appended
to its task. The run is keyed like every hook run (`hook_key`): a worker killed mid-hook is claimed
again and finds its finished handlers stored.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agents.hooks import Event, hook_key, run_hooks
from agents.hooks.models import handled_sql
from agents.orchestrator.models import Brain, Prompt
from config.sql import py_value


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


def pending_start(saga_id: Any, name: str, read: Sequence[Any]) -> Pending | None:
    """The SubagentStart to run for the run of `name` (`brain-….role`), or None: not a prompt's
    support worker (the primary, the reviewer), or no handler of its brain for that event. `read`:
    the values of START_COLUMNS, read with the run."""
    prompt_id, plan, expanded, text, brain, handled = read
    if prompt_id is None or not handled:
        return None
    slot = name.partition(".")[2]
    plan = py_value(Prompt, "plan", plan) or {}
    worker = next((w for w in plan.get("workers", []) if w.get("role") == slot), None)
    if worker is None:
        return None
    return Pending(
        saga_id=saga_id, prompt_id=str(py_value(Prompt, "id", prompt_id)), brain=brain, role=slot,
        goal=str(worker.get("goal", "")), prompt=expanded or text,
    )  # fmt: skip


def prompt_images(read: Sequence[Any]) -> list[str]:
    """The images of the prompt whose worker this run is (its plan's, set by routing), from the
    values of START_COLUMNS: what its model calls send, and need models that can see."""
    prompt_id, plan = read[0], read[1]
    images = (py_value(Prompt, "plan", plan) or {}).get("images") if prompt_id is not None else None
    return [str(url) for url in images] if isinstance(images, list) else []


# What pending_start() and prompt_images() read, in the statement that reads a worker's queued run
# (agents/executor.py: every task of a prompt's worker needs its prompt's images, every support
# worker's first task its SubagentStart, and a statement of their own would be one more round
# trip): the prompt that the run's delegator (`d`, the run's delegation) leads, the name of its
# brain, and whether that brain has a SubagentStart handler.
START_COLUMNS = f"sp.id, sp.plan, sp.expanded, sp.text, sb.name, {handled_sql(Event.SUBAGENT_START, brain='sb.name')}"
START_JOIN = (
    f"LEFT JOIN {Prompt._meta.db_table} sp ON sp.lead_id = d.delegator_id "
    f"LEFT JOIN {Brain._meta.db_table} sb ON sb.id = sp.brain_id"
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
