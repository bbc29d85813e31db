import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def celery_settings() -> dict[str, Any]:
    """The CELERY_ settings, copied once into a plain dict. Celery looks its settings up several
    times for each task it sends, and each lookup that falls through Django's settings object (as
    with `config_from_object("django.conf:settings")`) costs tens of microseconds."""
    from django.conf import settings

    return {name: getattr(settings, name) for name in dir(settings) if name.startswith("CELERY_")}


app = Celery("agora")
app.config_from_object(celery_settings(), namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def reconcile_at_start(sender: Any = None, **kwargs: Any) -> None:
    """A worker that starts after a crash re-rings whatever the crash left silent."""
    app.send_task("sagas.tasks.reconcile")
    app.send_task("agents.orchestrator.resume_prompts")
