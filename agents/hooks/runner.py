"""run_hooks: the matching handlers of one event, in parallel, each with its timeout; every
outcome journaled, stored under the caller's key as soon as it is known, and never run again."""

import json
import queue
import re
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from celery import current_task
from django.conf import settings
from django.db import IntegrityError, transaction

from agents.hooks.events import RULES, Event
from agents.hooks.execution import Raw, run_handler
from agents.hooks.models import HookHandler, HookResult, handlers_for
from agents.hooks.parsing import Verdict, interpret
from journal.actions import record

# A command or webhook enforces its own timeout (the command is killed) and reports it; the
# runner waits this much longer for that report before it stops waiting on its own.
REPORT_GRACE_S = 5.0


class HooksOutsideWorker(RuntimeError):
    """Hooks run handlers (processes, HTTP calls, code) and may take their whole timeout: only in
    a Celery worker, never in a web process, where they would delay a request."""


@dataclass(frozen=True)
class HookOutcome:
    """What the handlers of one event decided, in handler order (global first, then the brain's)."""

    event: Event
    key: str
    results: list[HookResult] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return any(r.status == HookResult.Status.BLOCKED for r in self.results)

    @property
    def blocked_by(self) -> str:
        return next((r.handler for r in self.results if r.status == HookResult.Status.BLOCKED), "")

    @property
    def reason(self) -> str:
        """The first blocking handler's reason, to end the prompt (or the worker) with."""
        return next((r.reason for r in self.results if r.status == HookResult.Status.BLOCKED), "")

    @property
    def context(self) -> str:
        """The context the handlers added, in handler order, one paragraph each ('' when none)."""
        return "\n\n".join(r.context for r in self.results if r.context)

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": self.event.value,
            "key": self.key,
            "blocked": self.blocked,
            "blocked_by": self.blocked_by,
            "reason": self.reason,
            "context": self.context,
            "handlers": [
                {
                    "handler": r.handler,
                    "status": r.status,
                    "duration_ms": r.duration_ms,
                    "reason": r.reason,
                    "context_chars": len(r.context),
                    "error": r.error,
                }
                for r in self.results
            ],
        }


def run_hooks(
    *,
    saga_id: UUID | str,
    event: Event | str,
    payload: dict[str, Any],
    key: str,
    brain: str = "",
    role: str = "",
    hooked: Collection[str] | None = None,
) -> HookOutcome:
    """Run the trusted handlers of `event` (global ones and `brain`'s) whose matcher matches `role`,
    and return what they decided. Handlers already stored under (`saga_id`, `key`) are not run
    again: a call retried after a crash returns the stored outcomes and runs only the handlers that
    had not finished. Handlers get `payload` with `event`, `saga`, `key`, `brain` and `role` as one
    JSON object. `hooked`: the events the caller read to have handlers for `brain` (with the rest
    it read); an event not among them runs nothing and reads nothing. Never call it inside a
    transaction: it waits on processes and HTTP."""
    if not (settings.AGORA_HOOKS_INLINE or current_task):
        raise HooksOutsideWorker("Hooks run in a Celery worker.")
    event = Event(event)
    if hooked is not None and event not in hooked:
        return HookOutcome(event=event, key=key)
    matching = [h for h in handlers_for(event, brain=brain) if matches(h, role)]
    if not matching:
        return HookOutcome(event=event, key=key)
    stored = {r.handler: r for r in HookResult.objects.filter(saga_id=saga_id, key=key)}
    todo = [h for h in matching if h.label not in stored]
    if todo:
        document = {**payload, "event": event.value, "saga": str(saga_id), "key": key, "brain": brain, "role": role}
        event_json = json.dumps(document, default=str)
        for handler, raw in run_in_parallel(todo, event_json):
            verdict = interpret(event, raw)
            stored[handler.label] = store(
                saga_id=saga_id, key=key, event=event, handler=handler, role=role, raw=raw, verdict=verdict
            )
    return HookOutcome(event=event, key=key, results=[stored[h.label] for h in matching])


def matches(handler: HookHandler, role: str) -> bool:
    """A blank matcher matches every call; otherwise the role, in full, by name or regex."""
    if not handler.matcher:
        return True
    return bool(role) and (handler.matcher == role or re.fullmatch(handler.matcher, role) is not None)


def longest_run(event: Event | str, *, brain: str = "") -> float:
    """The longest one run of `event`'s handlers for `brain` may take, in seconds (0: none): they
    run side by side, so the slowest one's deadline (run_in_parallel())."""
    return max((longest_wait(h) for h in handlers_for(event, brain=brain)), default=0.0)


def longest_wait(handler: HookHandler) -> float:
    """How long the runner waits for a handler: its timeout, and for a command or a webhook, which
    report their own timeout, the grace for that report (a python handler cannot be stopped)."""
    return handler.timeout_s + (0.0 if handler.type == HookHandler.Type.PYTHON else REPORT_GRACE_S)


def run_in_parallel(handlers: list[HookHandler], event_json: str) -> Iterator[tuple[HookHandler, Raw]]:
    """Start every handler at once and yield each one's output as soon as it has it, or a
    timeout when it has not answered by its deadline (a python handler cannot be killed: it is
    left to finish in its daemon thread, and what it returns then is dropped)."""
    results: queue.Queue[tuple[int, Raw]] = queue.Queue()
    started = time.monotonic()
    deadlines: dict[int, float] = {}
    for index, handler in enumerate(handlers):
        deadlines[index] = started + longest_wait(handler)
        threading.Thread(
            target=lambda i=index, h=handler: results.put((i, run_handler(h, event_json))),
            name=f"hook-{handler.label}",
            daemon=True,
        ).start()
    while deadlines:
        try:
            index, raw = results.get(timeout=max(0.0, min(deadlines.values()) - time.monotonic()))
        except queue.Empty:
            now = time.monotonic()
            for index in [i for i, d in deadlines.items() if d <= now]:
                del deadlines[index]
                handler = handlers[index]
                yield handler, Raw(timed_out=True, error=f"no answer within {handler.timeout_s:g} s",
                                   duration_ms=round((now - started) * 1000))  # fmt: skip
            continue
        if deadlines.pop(index, None) is not None:
            yield handlers[index], raw


def store(
    *, saga_id: UUID | str, key: str, event: Event, handler: HookHandler, role: str, raw: Raw, verdict: Verdict
) -> HookResult:
    """Keep one handler's outcome and journal it, together; if another try stored it first, that
    one stands and nothing is journaled twice."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                result = HookResult.objects.create(
                    saga_id=saga_id, key=key, event=event.value, handler=handler.label, status=verdict.status,
                    reason=verdict.reason, context=verdict.context, error=verdict.error, duration_ms=raw.duration_ms,
                )  # fmt: skip
        except IntegrityError:
            return HookResult.objects.get(saga_id=saga_id, key=key, handler=handler.label)
        record(
            saga_id=saga_id,
            type=RULES[event].journal_type,
            actor=f"hook:{handler.label}",
            data={
                "event": event.value,
                "handler": handler.label,
                "type": handler.type,
                "key": key,
                "role": role,
                "status": verdict.status,
                "decision": "block" if verdict.status == HookResult.Status.BLOCKED else "",
                "reason": verdict.reason,
                "duration_ms": raw.duration_ms,
                "context_chars": len(verdict.context),
                "error": verdict.error,
            },
        )
    return result


def stored_outcome(*, saga_id: UUID | str, event: Event | str, key: str) -> HookOutcome:
    """The outcomes stored so far under a key, for a caller that rang `run_hooks_task` and reads
    the result later."""
    results = HookResult.objects.filter(saga_id=saga_id, key=key)
    # run_hooks' order: global handlers, then the brain's (`brain/name`), each by name.
    ordered = sorted(results, key=lambda r: ("/" in r.handler, r.handler))
    return HookOutcome(event=Event(event), key=key, results=ordered)
