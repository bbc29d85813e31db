import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agora")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def reconcile_at_start(sender: Any = None, **kwargs: Any) -> None:
    """A worker that starts after a crash re-rings whatever the crash left silent."""
    app.send_task("sagas.tasks.reconcile")
