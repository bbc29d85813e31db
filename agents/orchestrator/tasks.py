"""Thin tasks: ids in, re-fetch, advance; safe to run twice (every step is a compare-and-set).

A step may leave runs for the task that advanced it to run at once (`steps.advance`), claimed in
its transaction: the task runs them itself, the way a `run_turn` task would, one Celery hand-off
and one transaction less each.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import Task, shared_task
from django.conf import settings
from django.utils import timezone

from agents.orchestrator import reads, steps
from agents.orchestrator.actions import ring_prompt
from agents.orchestrator.models import Prompt, lead_of

if TYPE_CHECKING:
    from agents.turns import Turns


@shared_task(name="agents.orchestrator.advance_prompt", acks_late=True, bind=True)
def advance_prompt(self: Task, prompt_id: str) -> None:
    run_here(steps.advance(prompt_id, worker=self.request.hostname or ""))


@shared_task(name="agents.orchestrator.worker_rested", acks_late=True, bind=True)
def worker_rested(self: Task, saga_id: str, name: str) -> None:
    run_here(advance_after(saga_id, name, worker=self.request.hostname or ""))


def advance_after(
    saga_id: str, name: str, *, worker: str, ahead: Callable[[], list[Prompt]] | None = None
) -> "list[Turns]":
    """A task of a prompt's worker ended: maybe its step is ready. The executor calls this after
    the worker's last commit, and runs what it returns (see `steps.advance`); `ahead`: what that
    last transaction read for it (read_ahead())."""
    here: list[Turns] = []
    for prompt in ahead() if ahead is not None else reads.running_prompts(saga_id, lead_of(name)):
        here += steps.advance(str(prompt.pk), prompt, worker=worker)
    return here


def read_ahead(saga_id: Any, name: str) -> Callable[[], list[Prompt]]:
    """What advance_after() reads, read in the worker's transaction that ends its task (its run
    finished or came to rest), with its COMMIT: on PostgreSQL no round trip, and none for the
    outcomes either when that ending makes the step ready. The reads see that ending and every
    commit before it, under the saga's lock; a worker whose ending commits later reads this one's
    in turn, as when each read after its own commit."""
    return reads.prompts_ahead(saga_id, lead_of(name))


def run_here(claimed: "list[Turns]") -> None:
    # Imported here: the executor imports this module (it rings the orchestrator when a worker rests).
    from agents.executor import run_claimed

    for turns in claimed:
        run_claimed(turns)


@shared_task(name="agents.orchestrator.resume_prompts")
def resume_prompts(everything: bool = False) -> int:
    """Periodic, and at each worker's start: ring the orchestrations still running that nothing has
    moved for `AGORA_RERING_S` (all of them at a worker's start), so that one whose doorbell was
    lost (a killed worker, a restart) carries on. A fresh one is left alone: its own tasks move it,
    and a doorbell every interval would only take a worker from them. Each re-ring touches the
    prompt (a compare-and-set), which spaces the next one."""
    now = timezone.now()
    due = now - timedelta(seconds=settings.AGORA_RERING_S)
    running = Prompt.objects.filter(status=Prompt.Status.RUNNING)
    ids = list((running if everything else running.filter(updated_at__lte=due)).values_list("pk", flat=True)[:500])
    rung = 0
    for prompt_id in ids:
        if everything or running.filter(pk=prompt_id, updated_at__lte=due).update(updated_at=now):
            ring_prompt(str(prompt_id))
            rung += 1
    return rung
