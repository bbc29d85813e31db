import os
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import User
from agents.orchestrator.actions import submit_prompt
from sagas.actions import add_agent, create_saga
from sagas.models import Saga

DEMO_TITLE = "Demo: API v2 migration"
DEFAULT_PROFILES = Path(__file__).resolve().parents[2] / "profiles" / "default.json"
BRAIN_PROFILES = Path(__file__).resolve().parents[2] / "profiles" / "brain.json"
DEFAULT_BRAINS = Path(__file__).resolve().parents[2] / "brains" / "default.json"
DEMO_PROMPT = "Migrate GET /v2/orders from page numbers to cursor pagination, with tests and a changelog entry."
DEMO_AGENTS = [
    ("coder", "Coder", "Implement the v2 orders API.", "demo-coder"),
    ("tester", "Tester", "Test the v2 orders API.", "demo-tester"),
    ("reviewer", "Reviewer", "Review the v2 changes.", "demo-reviewer"),
    # A team: spawns a scout and a checker, briefs both at once, collects their answers, lets one go.
    ("lead", "Lead", "Run the v2 research team.", "team-lead"),
]


class Command(BaseCommand):
    help = "Load the default agent profiles and create the demo saga once, owned by the demo user."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("load_profiles", str(DEFAULT_PROFILES), stdout=self.stdout)
        call_command("load_profiles", str(BRAIN_PROFILES), stdout=self.stdout)
        call_command("load_brains", str(DEFAULT_BRAINS), stdout=self.stdout)
        owner = User.objects.get(username=os.environ.get("DJANGO_SUPERUSER_USERNAME", "demo"))
        if Saga.objects.filter(title=DEMO_TITLE, owner=owner).exists():
            return
        # One transaction: every agent exists before any of their first turns runs.
        with transaction.atomic():
            saga = create_saga(title=DEMO_TITLE, goal="Ship v2 without breaking clients.", owner=owner)
            for name, role, task, profile in DEMO_AGENTS:
                add_agent(saga=saga, name=name, role=role, task=task, runtime="internal", profile=profile, by=owner)
            # One orchestration on scripted playbooks: three workers, a primary and a review.
            submit_prompt(saga=saga, by=owner, text=DEMO_PROMPT, idempotency_key="demo")
        self.stdout.write(f"Demo saga {saga.pk} created.")
