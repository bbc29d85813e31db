"""What a handler's output means for its event: JSON wins; plain text is context only where the
event takes it; anything else is journaled and ignored."""

import json
from dataclasses import dataclass
from typing import Any

from agents.hooks.events import RULES, Event
from agents.hooks.execution import Raw
from agents.hooks.models import HookResult
from config.payloads import storable_text

Status = HookResult.Status


@dataclass(frozen=True)
class Verdict:
    status: str
    reason: str = ""
    context: str = ""
    error: str = ""


def interpret(event: Event, raw: Raw) -> Verdict:
    """What the output means, its texts made storable (NUL and lone surrogates replaced): a
    handler's output is kept, never refused, and a string cut inside an emoji is no reason to fail."""
    verdict = meaning(event, raw)
    reason, context, error = (storable_text(text) for text in (verdict.reason, verdict.context, verdict.error))
    return Verdict(verdict.status, reason=reason, context=context, error=error)


def meaning(event: Event, raw: Raw) -> Verdict:
    if raw.timed_out:
        return Verdict(Status.TIMED_OUT, error=raw.error)
    if raw.error:
        return Verdict(Status.ERROR, error=raw.error)
    if raw.value is not None:
        return from_object(event, raw.value)
    text = raw.output.strip()
    if not text:
        return Verdict(Status.OK)
    if text[0] in "{[":
        try:
            value = json.loads(text)
        except ValueError as exc:
            return Verdict(Status.ERROR, error=f"unparsable JSON output: {exc}")
        if not isinstance(value, dict):
            return Verdict(Status.ERROR, error="JSON output that is not an object")
        return from_object(event, value)
    if RULES[event].plain_text_is_context:
        return Verdict(Status.OK, context=text)
    return Verdict(Status.IGNORED, error=f"{event} takes no plain-text output")


def from_object(event: Event, value: dict[str, Any]) -> Verdict:
    rules = RULES[event]
    decision = value.get("decision")
    context = value.get("additional_context")
    if decision not in (None, "", "allow", "block"):
        return Verdict(Status.ERROR, error=f"unknown decision {decision!r}")
    if context is not None and not isinstance(context, str):
        return Verdict(Status.ERROR, error="additional_context is not a string")
    ignored = []
    if decision == "block" and not rules.may_block:
        ignored.append(f"{event} cannot block")
        decision = None
    if context and not rules.adds_context:
        ignored.append(f"{event} takes no context")
        context = None
    if decision == "block":
        reason = value.get("reason")
        return Verdict(Status.BLOCKED, reason=str(reason) if reason else "Blocked by a hook.", context=context or "")
    if ignored and not context:
        return Verdict(Status.IGNORED, error="; ".join(ignored))
    return Verdict(Status.OK, context=context or "", error="; ".join(ignored))
