"""Helpers for the orchestrator tests: the shipped brain's files, the fake brain's models, and
prompts submitted and read back through the REST API."""

from pathlib import Path
from typing import Any

from django.test import Client
from rest_framework.test import APIClient

from accounts.models import User
from journal.models import JournalEvent
from sagas.models import Saga
from tests.support import wait_until

BRAIN_PROFILES = Path(__file__).resolve().parents[2] / "agents" / "profiles" / "brain.json"
BRAINS = Path(__file__).resolve().parents[2] / "agents" / "brains" / "default.json"

FAKE_MODELS = {"router": "router-m", "coder": "coder-m", "tester": "tester-m", "writer": "writer-m",
               "review": "review-m"}  # fmt: skip


def page_client(user: User) -> Client:
    """A browser's client, signed in as `user`: the saga page and its forms."""
    client = Client()
    client.force_login(user)
    return client


def submit(client: APIClient, saga: Saga, **body: Any) -> dict[str, Any]:
    response = client.post(f"/api/v1/sagas/{saga.pk}/prompts/", body, format="json")
    assert response.status_code == 202, response.content
    return dict(response.json())


def settled(client: APIClient, prompt_id: str, *, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = dict(client.get(f"/api/v1/prompts/{prompt_id}/").json())
        return body if body["status"] != "running" else None

    return wait_until(done, timeout=timeout, what=f"prompt {prompt_id} to settle")


def types(saga: Saga) -> list[str]:
    return list(JournalEvent.objects.filter(saga=saga).order_by("seq").values_list("type", flat=True))


def request_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body["messages"])
