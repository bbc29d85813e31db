"""The orchestrator end to end: the REST API, a real Celery worker, the scripted provider and the
local fake OpenAI-compatible server."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from agents.actions import load_profiles
from agents.orchestrator.actions import load_brains
from journal.models import JournalEvent
from sagas.models import Collaborator, Delegation, Saga
from tests.support import CeleryWorker, wait_until

BRAIN_PROFILES = Path(__file__).resolve().parents[2] / "agents" / "profiles" / "brain.json"
BRAINS = Path(__file__).resolve().parents[2] / "agents" / "brains" / "default.json"


@pytest.fixture
def default_brain(transactional_db: None) -> None:
    load_profiles(entries=json.loads(BRAIN_PROFILES.read_text()))
    load_brains(entries=json.loads(BRAINS.read_text()))


@pytest.fixture
def client_for() -> Callable[[User], APIClient]:
    def make(user: User) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        return client

    return make


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


def test_a_prompt_runs_workers_a_primary_and_a_review_on_scripted_playbooks(
    worker: CeleryWorker, default_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    client = client_for(alice)
    started = submit(client, saga, prompt="Migrate GET /v2/orders to cursor pagination, with tests and docs.")
    assert started["status"] == "running" and started["lead"].startswith("agent:brain-")

    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed", body
    plan = body["plan"]
    assert plan["source"] == "router" and plan["primary_role"] == "coder" and plan["requires_review"] is True
    assert [w["role"] for w in plan["workers"]] == ["researcher", "tester", "writer"]
    assert [(r["role"], r["status"]) for r in body["results"]] == [
        ("researcher", "completed"), ("tester", "completed"), ("writer", "completed")
    ]  # fmt: skip
    tester = body["results"][1]
    assert (
        tester["task_id"] == f"task:{body['prompt_id']}:tester" and tester["parent_id"] == f"prompt:{body['prompt_id']}"
    )
    assert tester["next_questions"] and "Twelve cases" in tester["summary"]
    assert "opaque cursor" in body["answer"]
    assert body["review"]["decision"] == "approve" and body["review"]["source"] == "reviewer"
    assert body["final_answer"].startswith(body["answer"]) and "Review: approve" in body["final_answer"]
    # Every worker is a delegation of the lead, and each ran once.
    lead = Collaborator.objects.get(saga=saga, name=started["lead"].removeprefix("agent:"))
    delegates = Delegation.objects.filter(delegator=lead).values_list("delegate__name", flat=True)
    assert sorted(n.split(".", 1)[1] for n in delegates) == ["primary", "researcher", "review", "tester", "writer"]
    seen = types(saga)
    assert seen.count("worker_start") == 5 and seen.count("worker_end") == 5
    order = [t for t in seen if t in ("prompt.submitted", "plan.created", "primary.completed", "review.completed",
                                      "prompt.completed")]  # fmt: skip
    assert order == ["prompt.submitted", "plan.created", "primary.completed", "review.completed", "prompt.completed"]
    assert lead.run.status == "completed"
