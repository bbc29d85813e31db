from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from config import metrics
from sagas import actions
from sagas.models import Collaborator, Run, SteeringItem
from sagas.wakeups import ring_remote_call, ring_run


@shared_task(name="sagas.tasks.reconcile")
def reconcile() -> dict[str, int]:
    """Re-ring every doorbell that should have rung. Idempotent: two at once do each thing once,
    because every change below is a compare-and-set."""
    now = timezone.now()
    counts = {
        "waits_ended": sum(actions.end_wait(request_id=i) for i in list(actions.due_wait_ids(now))),
        "expired": sum(actions.expire_request(request_id=i) for i in list(actions.due_expiry_ids(now))),
    }
    counts["teammates_shut_down"] = sum(
        actions.shut_down_idle(run_id=i, now=now) for i in actions.idle_teammate_ids(now)
    )
    counts["runs_rung"] = requeue_runs(now)
    due = actions.due_remote_calls(now)
    for call_id, step in due:
        ring_remote_call(call_id, step)
    counts["remote_calls_rung"] = len(due)
    return counts


def requeue_runs(now: datetime) -> int:
    """Internal runs that should be moving and are not: an expired lease (a crashed worker), a
    passed wait, an idle run with unread steering, a queued turn whose message was lost."""
    internal = Run.objects.filter(collaborator__runtime=Collaborator.Runtime.INTERNAL)
    # Marked as last touched long ago, so that the re-ring below picks them up at once.
    due_now = now - timedelta(seconds=settings.AGORA_RERING_S)
    for run_id in internal.filter(status=Run.Status.RUNNING, lease_until__lt=now).values_list("pk", flat=True)[:500]:
        if actions.reclaim_lapsed_turn(run_id=run_id, now=now, mark=due_now):
            metrics.LEASE_RECLAIMS.inc()
    internal.filter(status=Run.Status.WAITING, wait_until__lt=now).update(
        status=Run.Status.QUEUED, wait_until=None, updated_at=due_now
    )
    unread = SteeringItem.objects.filter(recipient=OuterRef("collaborator"), consumed_at__isnull=True)
    internal.filter(Exists(unread), status=Run.Status.IDLE).update(status=Run.Status.QUEUED, updated_at=due_now)
    rung = 0
    for run_id in internal.filter(status=Run.Status.QUEUED, updated_at__lte=due_now).values_list("pk", flat=True)[:500]:
        # Touching updated_at spaces the next re-ring; a duplicate turn message is harmless
        # because the executor claims a turn with a compare-and-set.
        if Run.objects.filter(pk=run_id, status=Run.Status.QUEUED, updated_at__lte=due_now).update(updated_at=now):
            ring_run(run_id)
            rung += 1
    metrics.WAKEUPS_RERUNG.inc(rung)
    return rung
