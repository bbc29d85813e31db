from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agent runtime"

    def ready(self) -> None:
        from celery.signals import worker_init

        from agents.providers import warm

        worker_init.connect(warm, dispatch_uid="agents.warm_providers")
