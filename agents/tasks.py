from celery import Task, shared_task

from agents import executor
from agents.hooks.tasks import run_hooks_task  # noqa: F401  (registered with the worker through this module)


@shared_task(name="agents.tasks.run_turn", acks_late=True, bind=True)
def run_turn(self: Task, run_id: str) -> None:
    """One turn of one internal run. Safe to deliver twice: the turn is claimed by compare-and-set."""
    executor.run_turn(run_id, worker=self.request.hostname or "")


# The orchestrator's tasks register with this module's (Celery discovers `agents.tasks`).
from agents.orchestrator import tasks as orchestrator_tasks  # noqa: E402, F401
