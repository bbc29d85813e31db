"""The task a caller rings when it wants a hook run off its own path (the web process never runs
handlers): ids and JSON in; the outcome is stored under the key (`stored_outcome`)."""

from typing import Any

from celery import shared_task

from agents.hooks.runner import run_hooks


@shared_task(name="agents.hooks.run_hooks", acks_late=True)
def run_hooks_task(
    saga_id: str, event: str, payload: dict[str, Any], key: str, brain: str = "", role: str = ""
) -> None:
    """Safe to deliver twice: handlers already stored under the key do not run again."""
    run_hooks(saga_id=saga_id, event=event, payload=payload, key=key, brain=brain, role=role)
