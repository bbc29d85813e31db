from django.apps import AppConfig


class A2aConfig(AppConfig):
    name = "gateways.a2a"
    label = "a2a"
    verbose_name = "A2A gateway"
