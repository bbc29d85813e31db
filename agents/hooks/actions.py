"""Loading hook handlers from a file's entries: all of them or none, and never an untrusted one."""

import re
from typing import Any

from django.db import transaction
from django.utils.module_loading import import_string

from agents.actions import repeated
from agents.hooks.events import Event
from agents.hooks.models import HookHandler

TARGETS = {HookHandler.Type.COMMAND: "argv", HookHandler.Type.WEBHOOK: "url", HookHandler.Type.PYTHON: "callable"}
KEYS = {"name", "brain", "event", "matcher", "type", "argv", "url", "callable", "timeout_s", "trusted"}
MAX_TIMEOUT_S = 600.0


class InvalidHooks(ValueError):
    pass


class UntrustedHook(InvalidHooks):
    """A handler without `"trusted": true`. Hooks run commands, call URLs and import code with the
    worker's rights, so each one must be reviewed and marked trusted before Agora loads it."""


@transaction.atomic
def load_hooks(*, entries: Any) -> tuple[int, int]:
    """Create or update handlers by (brain, name); all of them or none. Returns (created, updated)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidHooks("A hooks file holds a list of objects.")
    if (twice := repeated([(entry.get("brain") or "", entry.get("name")) for entry in entries])) is not None:
        brain, name = twice
        raise InvalidHooks(f"Hook {name!r}{f' of brain {brain!r}' if brain else ''} is in the file twice.")
    created = updated = 0
    for entry in entries:
        fields = check_entry(entry)
        handler = HookHandler.objects.filter(brain=fields["brain"], name=fields["name"]).first() or HookHandler()
        is_new = handler.pk is None
        for name, value in fields.items():
            setattr(handler, name, value)
        handler.full_clean()
        handler.save()
        created, updated = created + is_new, updated + (not is_new)
    return created, updated


def check_entry(entry: dict[str, Any]) -> dict[str, Any]:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidHooks("Every hook needs a name.")
    label = f"Hook {name!r}"
    if entry.get("trusted") is not True:
        raise UntrustedHook(
            f'{label} is not trusted: review what it runs, then set "trusted": true. Untrusted hooks are never loaded.'
        )
    if unknown := set(entry) - KEYS:
        raise InvalidHooks(f"{label} has unknown keys: {', '.join(sorted(unknown))}.")
    if not isinstance(entry.get("event"), str) or entry["event"] not in Event._value2member_map_:
        raise InvalidHooks(f"{label}: event is one of {', '.join(e.value for e in Event)}.")
    kind = entry.get("type")
    if not isinstance(kind, str) or kind not in TARGETS:
        raise InvalidHooks(f"{label}: type is one of {', '.join(TARGETS)}.")
    target = TARGETS[HookHandler.Type(kind)]
    if others := {t for t in TARGETS.values() if t != target} & set(entry):
        raise InvalidHooks(f"{label}: a {kind} hook has no {', '.join(sorted(others))}.")
    value = entry.get(target)
    if kind == HookHandler.Type.COMMAND and not (
        isinstance(value, list) and value and all(isinstance(a, str) and a for a in value)
    ):
        raise InvalidHooks(f"{label}: argv is a non-empty list of strings (no shell runs it).")
    if kind == HookHandler.Type.WEBHOOK and not (isinstance(value, str) and re.match(r"https?://", value)):
        raise InvalidHooks(f"{label}: url is an http:// or https:// URL.")
    if kind == HookHandler.Type.PYTHON:
        if not isinstance(value, str) or not value:
            raise InvalidHooks(f"{label}: callable is a dotted path.")
        try:
            if not callable(import_string(value)):
                raise InvalidHooks(f"{label}: {value} is not callable.")
        except ImportError as exc:
            raise InvalidHooks(f"{label}: cannot import {value}: {exc}") from exc
    matcher = entry.get("matcher") or ""
    if not isinstance(matcher, str):
        raise InvalidHooks(f"{label}: matcher is a role name or a regex.")
    try:
        re.compile(matcher)
    except re.error as exc:
        raise InvalidHooks(f"{label}: matcher is not a valid regex: {exc}") from exc
    timeout = entry.get("timeout_s", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise InvalidHooks(f"{label}: timeout_s is a number of seconds, above 0 and at most {MAX_TIMEOUT_S:g}.")
    brain = entry.get("brain") or ""
    if not isinstance(brain, str):
        raise InvalidHooks(f"{label}: brain is a brain's name.")
    return {
        "name": name,
        "brain": brain,
        "event": entry["event"],
        "matcher": matcher,
        "type": kind,
        "argv": value if target == "argv" else [],
        "url": value if target == "url" else "",
        "callable": value if target == "callable" else "",
        "timeout_s": float(timeout),
        "trusted": True,
    }
