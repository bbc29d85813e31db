from celery import shared_task

from agents import executor
from agents.hooks.tasks import run_hooks_task  # noqa: F401  (registered with the worker through this module)


@shared_task(name="agents.tasks.run_turn", acks_late=True)
def run_turn(run_id: str) -> None:
    """One turn of one internal run. Safe to deliver twice: the turn is claimed by compare-and-set."""
    executor.run_turn(run_id)
