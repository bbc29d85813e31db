from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "journal"
    verbose_name = "Journal"
