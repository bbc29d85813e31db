from django.apps import AppConfig


class SagasConfig(AppConfig):
    name = "sagas"
    verbose_name = "Sagas"

    def ready(self) -> None:
        # The journal's readers (export, WebSocket) live below the kernel and cannot import it: they
        # get the kernel's one visibility rule for events through this hand-over.
        from journal.access import provide_reader_rule
        from sagas.access import JournalLens

        provide_reader_rule(JournalLens)

        # The runs by status that `/metrics` reports, read from the kernel's table at scrape time.
        from config.metrics import provide_scrape_collector
        from sagas.metrics import RunsByStatus

        provide_scrape_collector(RunsByStatus)

        from django.db.models.signals import post_migrate

        from sagas.access import forget_permission_ids

        post_migrate.connect(forget_permission_ids, dispatch_uid="sagas.forget_permission_ids")

        from celery.signals import worker_init

        from sagas.access import warm_permission_ids

        worker_init.connect(warm_permission_ids, dispatch_uid="sagas.warm_permission_ids")
