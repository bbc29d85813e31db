"""Python hook handlers for the tests (loaded by dotted path, in the test process or a worker)."""

import time
from typing import Any


def add_context(event: dict[str, Any]) -> dict[str, Any]:
    return {"additional_context": f"python saw {event['event']} for {event.get('role') or 'the prompt'}"}


def block(event: dict[str, Any]) -> dict[str, Any]:
    return {"decision": "block", "reason": f"python policy refuses: {event.get('prompt', '')}"}


def plain(event: dict[str, Any]) -> str:
    return "plain python context"


def crash(event: dict[str, Any]) -> None:
    raise ValueError("the handler's own bug")


def slow(event: dict[str, Any]) -> dict[str, Any]:
    time.sleep(3)
    return {"decision": "block", "reason": "too late to count"}


not_callable = 42
