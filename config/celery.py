import logging
import os
import threading
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_process_shutdown, worker_ready

from config.liveness import WorkerBeat

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
logger = logging.getLogger(__name__)


def celery_settings() -> dict[str, Any]:
    """The CELERY_ settings, copied once into a plain dict under Celery's current lowercase names
    (CELERY_TASK_ACKS_LATE → task_acks_late). Celery looks its settings up several times for each
    task it sends, and each lookup that falls through Django's settings object (as with
    `config_from_object("django.conf:settings")`) costs tens of microseconds. Handing Celery the
    prefixed names instead makes it take some for their pre-4.0 namesakes (CELERY_RESULT_BACKEND,
    CELERY_ACCEPT_CONTENT, ...) and print a deprecation warning for each at every worker start."""
    from django.conf import settings

    names = [name for name in dir(settings) if name.startswith("CELERY_")]
    conf = {name.removeprefix("CELERY_").lower(): getattr(settings, name) for name in names}
    # Celery's Django fixup reads this one under its Django name only.
    conf["CELERY_DB_REUSE_MAX"] = conf.pop("db_reuse_max", None)
    return conf


app = Celery("agora")
app.config_from_object(celery_settings())
app.autodiscover_tasks()
app.steps["consumer"].add(WorkerBeat)  # what /healthz counts as a live worker


@worker_ready.connect
def reconcile_at_start(sender: Any = None, **kwargs: Any) -> None:
    """A worker that starts after a crash re-rings whatever the crash left silent."""
    app.send_task("sagas.tasks.reconcile")
    app.send_task("agents.orchestrator.resume_prompts", kwargs={"everything": True})


@worker_init.connect
def serve_metrics(sender: Any = None, **kwargs: Any) -> None:
    """A worker host's metrics, when METRICS_PORT asks for them (README, "Observability")."""
    from config.metrics import start_worker_exporter  # here: `python -m config.metrics_dir` imports this package

    start_worker_exporter()


@worker_process_init.connect
def open_doorbells(**kwargs: Any) -> None:
    """A pool process makes the thread that sends its live notifications and the channel layer they
    go through (config/notify.py), and, on a thread of its own, connects to the broker and declares
    the queue its doorbells go to, as it starts rather than at its first doorbell and first journal
    event: those (most often a step ringing the support workers it has just started, before the
    first of them calls its model) waited 10 to 25 ms for it all. The process does not wait for the
    broker: one that does not answer is tried again at the first doorbell, as before."""
    from channels.layers import get_channel_layer  # here: Django is not set up when this module loads

    from config.notify import notifier

    notifier()
    get_channel_layer()
    threading.Thread(target=connect_producer, name="open-doorbells", daemon=True).start()


def connect_producer() -> None:
    try:
        with app.producer_pool.acquire(block=True) as producer:
            if producer.connection is not None:  # once, not the transport's retries over seconds
                producer.connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
            producer.maybe_declare(app.amqp.queues[app.conf.task_default_queue])
    except Exception as exc:  # noqa: BLE001 (nothing waits for this thread)
        logger.warning("could not connect to the broker yet: %s", exc)


@worker_process_shutdown.connect
def pool_process_exited(pid: int | None = None, **kwargs: Any) -> None:
    from config.metrics import process_exited

    process_exited(pid or os.getpid())
