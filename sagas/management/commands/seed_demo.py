import os
from typing import Any

from django.core.management.base import BaseCommand

from accounts.models import User
from sagas.actions import create_saga
from sagas.models import Saga

DEMO_TITLE = "Demo: API v2 migration"


class Command(BaseCommand):
    help = "Create the demo saga once, owned by the demo user."

    def handle(self, *args: Any, **options: Any) -> None:
        owner = User.objects.get(username=os.environ.get("DJANGO_SUPERUSER_USERNAME", "demo"))
        if Saga.objects.filter(title=DEMO_TITLE, owner=owner).exists():
            return
        saga = create_saga(title=DEMO_TITLE, goal="Ship v2 without breaking clients.", owner=owner)
        self.stdout.write(f"Demo saga {saga.pk} created.")
