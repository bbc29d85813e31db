"""Thin tasks: ids in, re-fetch, advance; safe to run twice (every step is a compare-and-set)."""

from celery import shared_task

from agents.orchestrator import steps
from agents.orchestrator.actions import ring_prompt
from agents.orchestrator.models import LEAD_PREFIX, Prompt


@shared_task(name="agents.orchestrator.advance_prompt", acks_late=True)
def advance_prompt(prompt_id: str) -> None:
    steps.advance(prompt_id)


@shared_task(name="agents.orchestrator.worker_rested", acks_late=True)
def worker_rested(saga_id: str, name: str) -> None:
    """Rung by the executor when a task of a prompt's worker ends: maybe its step is ready."""
    lead = name.split(".", 1)[0]
    for prompt_id in Prompt.objects.filter(saga_id=saga_id, lead__name=lead, status=Prompt.Status.RUNNING).values_list(
        "pk", flat=True
    ):
        steps.advance(str(prompt_id))


@shared_task(name="agents.orchestrator.resume_prompts")
def resume_prompts() -> int:
    """Periodic, and at each worker's start: ring every orchestration still running, so that one
    whose doorbell was lost (a killed worker, a restart) carries on."""
    ids = list(Prompt.objects.filter(status=Prompt.Status.RUNNING).values_list("pk", flat=True)[:500])
    for prompt_id in ids:
        ring_prompt(str(prompt_id))
    return len(ids)


def is_brain_worker(name: str) -> bool:
    return name.startswith(LEAD_PREFIX) and "." in name
