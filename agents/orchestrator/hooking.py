"""The hooks around the orchestration's steps, and the step's lease while they run.

A handler's result is stored only once it has finished, so a step run again meanwhile (a second
doorbell) would run it again: the step that runs hooks holds a lease on the prompt's step
(`step_until`) for as long as they may take, read off their timeouts, and a step that finds it
held leaves the step to its holder. Routing holds it for the router call too. A step that fails on
the database gives its lease back (release_step()); one whose worker was killed leaves it to lapse,
and the step to the periodic resume after that.
"""

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from agents.hooks import Event, hook_key, longest_run, run_hooks
from agents.hooks.lifecycle import FEEDBACK_HEADING
from agents.hooks.models import handlers_for
from agents.orchestrator.models import Prompt
from agents.orchestrator.reads import Outcome
from config.sql import db_value, prepared

logger = logging.getLogger(__name__)
Step = Prompt.Step


def claim_routing(prompt: Prompt) -> bool:
    """A lease on the router call and the hooks before it, so that the periodic resume does not
    ask the router again (nor run those hooks again) while a slow router or hook is still at it."""
    hooks = hooks_time(prompt, {Event.SESSION_START: 1, Event.USER_PROMPT_SUBMIT: 1})
    return claim_step(prompt, Step.ROUTING, settings.AGORA_ROUTING_LEASE_S + hooks)


def hold_for_hooks(prompt: Prompt, step: str, runs: dict[Event, int]) -> bool:
    """A later step's lease while its hooks run (`runs`: how many runs of each event, one after
    another), so that a second doorbell meanwhile (the periodic resume once the step is
    `AGORA_RERING_S` old, two workers ending together) does not run a handler that has not stored
    its result yet a second time; False: another task holds it. Nothing to hold, and nothing read,
    when the brain has no handler for them."""
    seconds = hooks_time(prompt, runs)
    return not seconds or claim_step(prompt, step, seconds)


def hooks_time(prompt: Prompt, runs: dict[Event, int]) -> float:
    """The longest the prompt's brain's handlers of these events may take, each event run `runs`
    times one after another."""
    brain = prompt.brain.name
    return sum(n * longest_run(event, brain=brain) for event, n in runs.items() if n and hooked(prompt, event))


def claim_step(prompt: Prompt, step: str, seconds: float) -> bool:
    """The step's lease for `seconds`, if no other task holds it; a lapsed one (a killed worker)
    is free. This copy of the prompt keeps the lease it took (`held_until`), for release_step()."""
    now = timezone.now()
    lease = now + timedelta(seconds=seconds)
    params = [db_value(Prompt, "step_until", lease), db_value(Prompt, "id", prompt.pk), step,
              db_value(Prompt, "step_until", now)]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_STEP_SQL, params)
        claimed = bool(cursor.rowcount)
    prompt.held_until = lease if claimed else None
    return claimed


def release_step(prompt: Prompt, step: str) -> None:
    """Give back the lease this copy took, if it still is the step's (a step that failed on the
    database: its retry, or the periodic resume, takes the step at once, not once the lease lapses).
    The connection may be the failure's: then the lease is left to lapse."""
    held, prompt.held_until = prompt.held_until, None
    if held is None:
        return
    params = [db_value(Prompt, "id", prompt.pk), step, db_value(Prompt, "step_until", held)]
    try:
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE_STEP_SQL, params)
    except DatabaseError:
        logger.warning("prompt %s: the %s step's lease is left to lapse", prompt.pk, step, exc_info=True)


_CLAIM_STEP_SQL = prepared(
    f"UPDATE {Prompt._meta.db_table} SET step_until = %s "
    "WHERE id = %s AND step = %s AND (step_until IS NULL OR step_until < %s)"
)
_RELEASE_STEP_SQL = prepared(
    f"UPDATE {Prompt._meta.db_table} SET step_until = NULL WHERE id = %s AND step = %s AND step_until = %s"
)


def hooked(prompt: Prompt, event: Event) -> bool:
    """Whether the event has handlers for this brain at all: asked once for every worker, rather
    than once per worker when there are none (and read with the prompt by a step)."""
    if prompt.hooked_events is not None:
        return event in prompt.hooked_events
    return bool(handlers_for(event, brain=prompt.brain.name))


def subagent_stop(prompt: Prompt, done: list[tuple[dict[str, Any], Outcome, dict[str, Any]]]) -> None:
    """SubagentStop after each successful result (no block, no context: it observes)."""
    for worker, outcome, result in done if hooked(prompt, Event.SUBAGENT_STOP) else []:
        if outcome.failed:
            continue
        run_hooks(
            saga_id=prompt.saga_id, event=Event.SUBAGENT_STOP, brain=prompt.brain.name, role=worker["role"],
            key=hook_key(prompt.pk, Event.SUBAGENT_STOP, worker["role"]),
            payload={"prompt_id": str(prompt.pk), "result": result},
        )  # fmt: skip


def stop_feedback(prompt: Prompt, answer: str) -> str:
    """Stop, after the primary and the review: its context is appended to the answer as feedback."""
    outcome = run_hooks(
        saga_id=prompt.saga_id, event=Event.STOP, brain=prompt.brain.name, key=hook_key(prompt.pk, Event.STOP),
        payload={"prompt_id": str(prompt.pk), "answer": answer}, hooked=prompt.hooked_events,
    )  # fmt: skip
    return f"{answer}\n\n{FEEDBACK_HEADING}\n{outcome.context}" if outcome.context else answer
