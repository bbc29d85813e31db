"""The orchestrator's side of hooks: the steps before routing, and the key of each hook run.

Before routing, in the Celery task that advances a prompt:

    SessionStart (the raw prompt) → expand references → UserPromptSubmit (the expanded prompt)

Either hook may block; both may add context, appended to the prompt as one section. Each worker
then runs `run_hooks(event=Event.SUBAGENT_START, role=…, key=hook_key(prompt, event, worker))`
before its first model call (a block fails that worker only, with the reason), SubagentStop after
its successful result, and Stop after the primary and the review (its context is feedback).
"""

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from agents.hooks.events import Event
from agents.hooks.runner import HookOutcome, run_hooks
from agents.references import expand_references
from sagas.models import Saga

CONTEXT_HEADING = "--- Context from hooks ---"
# Stop's context, appended to the final answer under this line (the plan view finds it there).
FEEDBACK_HEADING = "--- Feedback from hooks ---"


def hook_key(prompt_id: Any, event: Event, worker: str = "") -> str:
    """The key a hook run is stored under: one per prompt, event and (for Subagent events) worker,
    so that a step run again after a crash finds it and runs no finished handler twice."""
    return f"prompt:{prompt_id}:{event.value}" + (f":{worker}" if worker else "")


@dataclass(frozen=True)
class PreparedPrompt:
    """A prompt ready to route, or the block that ended it."""

    text: str
    images: tuple[str, ...] = ()  # the image artifacts the prompt references, by name
    blocked_by: str = ""  # the blocking handler's label
    reason: str = ""
    event: Event | None = None  # the event that blocked
    hooks: tuple[HookOutcome, ...] = ()

    @property
    def blocked(self) -> bool:
        return self.event is not None


def prepare_prompt(
    *, saga: Saga, user: Any, prompt_id: Any, text: str, brain: str = "", hooked: Collection[str] | None = None
) -> PreparedPrompt:
    """Run SessionStart on the raw prompt, expand its references as `user` may see them (raising
    the kernel's `not_found` or `invalid_payload` as `expand_references` does), run UserPromptSubmit
    on the expanded prompt, and append the context both added. Hook handlers get `prompt` and
    `prompt_id` in their event JSON; `hooked` as run_hooks() takes it."""
    base = {"prompt_id": str(prompt_id)}
    start = run_hooks(
        saga_id=saga.pk, event=Event.SESSION_START, payload={**base, "prompt": text},
        key=hook_key(prompt_id, Event.SESSION_START), brain=brain, hooked=hooked,
    )  # fmt: skip
    if start.blocked:
        return blocked(text, start)
    expanded, images = expand_references(text=text, saga=saga, user=user)
    submit = run_hooks(
        saga_id=saga.pk, event=Event.USER_PROMPT_SUBMIT, payload={**base, "prompt": expanded},
        key=hook_key(prompt_id, Event.USER_PROMPT_SUBMIT), brain=brain, hooked=hooked,
    )  # fmt: skip
    if submit.blocked:
        return blocked(expanded, start, submit)
    contexts = [o.context for o in (start, submit) if o.context]
    if contexts:
        expanded = "\n\n".join([expanded, CONTEXT_HEADING, *contexts])
    return PreparedPrompt(text=expanded, images=tuple(images), hooks=(start, submit))


def blocked(text: str, *outcomes: HookOutcome) -> PreparedPrompt:
    last = outcomes[-1]
    return PreparedPrompt(text=text, blocked_by=last.blocked_by, reason=last.reason, event=last.event, hooks=outcomes)
