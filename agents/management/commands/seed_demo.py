import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import CommandError, call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import User
from agents.orchestrator.actions import submit_prompt
from sagas.actions import add_agent, create_saga, find_collaborator, set_exposed
from sagas.models import Saga

DEMO_TITLE = "Demo: API v2 migration"
DEFAULT_PROFILES = Path(__file__).resolve().parents[2] / "profiles" / "default.json"
A2A_TITLE = "Demo: A2A"
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
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "demo")
        owner = User.objects.filter(username=username).first()
        if owner is None:  # before anything is loaded
            raise CommandError(f"No user {username!r} to own the demo: run `manage.py ensure_demo_user` first.")
        call_command("load_profiles", str(DEFAULT_PROFILES), stdout=self.stdout)
        call_command("load_profiles", str(BRAIN_PROFILES), stdout=self.stdout)
        call_command("load_brains", str(DEFAULT_BRAINS), stdout=self.stdout)
        self.seed_a2a(owner)
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

    def seed_a2a(self, owner: User) -> None:
        """A saga with two scripted agents exposed over A2A (`echo` replies with what it was sent,
        `asker` asks what it is for first: an input-required task, `chat` asks again after each
        message until the client says it is done: a task of many messages), and the token of an external
        agent of that saga for A2A clients (kept in the data dir: a token is shown only once)."""
        token_path = settings.DATA_DIR / "a2a_demo_token"
        saga = Saga.objects.filter(title=A2A_TITLE, owner=owner).first()
        if saga is None or not token_path.exists():
            with transaction.atomic():
                saga = create_saga(title=A2A_TITLE, goal="Answer A2A clients.", owner=owner)
                add_agent(saga=saga, name="echo", role="Echo", task="Reply with what you were sent.",
                          runtime="internal", profile="responder", resumable=True, by=owner)  # fmt: skip
                set_exposed(saga=saga, handle="agent:echo", exposed=True, by=owner)
                _, token = add_agent(saga=saga, name="a2a-client", role="A2A client", task="Call the echo agent.",
                                     runtime="external", by=owner)  # fmt: skip
            token_path.write_text(f"{token}\n")
            token_path.chmod(0o600)
        if find_collaborator(saga, "agent:asker") is None:  # sagas seeded before it joined get it too
            with transaction.atomic():
                add_agent(saga=saga, name="asker", role="Asker", task="Ask what it is for, then answer.",
                          runtime="internal", profile="asker", resumable=True, by=owner)  # fmt: skip
                set_exposed(saga=saga, handle="agent:asker", exposed=True, by=owner)
        if find_collaborator(saga, "agent:chat") is None:
            with transaction.atomic():
                add_agent(saga=saga, name="chat", role="Chat", task="Keep asking until the client is done.",
                          runtime="internal", profile="chat", resumable=True, by=owner)  # fmt: skip
                set_exposed(saga=saga, handle="agent:chat", exposed=True, by=owner)
        base = f"http://{os.environ.get('WEB_HOST', '127.0.0.1')}:{os.environ.get('WEB_PORT', '8000')}"
        self.stdout.write(
            f"A2A agent: {base}/a2a/{saga.pk}/echo/ (card at .well-known/agent-card.json), token in {token_path}"
        )
        self.stdout.write(f"A2A agent that asks back first: {base}/a2a/{saga.pk}/asker/")
        self.stdout.write(f"A2A agent that talks until you say done: {base}/a2a/{saga.pk}/chat/")
