from celery import shared_task

from agents import executor


@shared_task(name="agents.tasks.run_turn", acks_late=True)
def run_turn(run_id: str) -> None:
    """One turn of one internal run. Safe to deliver twice: the turn is claimed by compare-and-set."""
    executor.run_turn(run_id)


from agents.hooks.tasks import run_hooks_task  # noqa: E402  (registered with the worker through this module)

__all__ = ["run_hooks_task", "run_turn"]
