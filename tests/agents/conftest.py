import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from agents import providers
from agents.actions import load_profiles
from agents.orchestrator.actions import load_brains
from sagas import actions
from sagas.models import Collaborator, Saga
from tests.agents.fake_llm import FakeLLM
from tests.agents.orchestration_support import BRAIN_PROFILES, BRAINS, FAKE_MODELS
from tests.sagas.kernel import AddAgent
from tests.support import CeleryWorker

LEASE_S = "4"


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    server = FakeLLM()
    yield server
    server.stop()


@pytest.fixture
def model_here(fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    """The fake provider, called from this process (no worker runs here): a client for its address."""
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    providers.openai_provider.cache_clear()
    yield fake_llm
    providers.openai_provider.cache_clear()


@pytest.fixture
def runtime_env(fake_llm: FakeLLM, request: pytest.FixtureRequest) -> dict[str, str]:
    """What a worker needs to reach the fake provider, with short leases so crashes heal fast
    (a test may change any of it: parametrize `runtime_env` indirectly with a dict)."""
    return {
        "OPENAI_BASE_URL": fake_llm.url,
        "OPENAI_API_KEY": "test",
        "OPENAI_TIMEOUT_S": "2",
        "AGORA_LEASE_S": LEASE_S,
        **getattr(request, "param", {}),
    }


@pytest.fixture
def worker(
    transactional_db: None, redis_url: str, artifacts: Path, runtime_env: dict[str, str]
) -> Iterator[CeleryWorker]:
    started = CeleryWorker(redis_url, artifacts, env=runtime_env)
    yield started
    started.kill()  # its work is over: no need to wait for a warm shutdown


@pytest.fixture
def saga(transactional_db: None, alice: User) -> Saga:
    return actions.create_saga(title="Runtime", goal="Test the runtime", owner=alice, policy=Saga.Policy.TREE)


@pytest.fixture
def add_internal(saga: Saga, alice: User) -> AddAgent:
    """Add an internal agent on a fresh profile; its first turn is queued when the add commits."""

    def add(name: str, *, model: str, fallback: list[str] | None = None, **profile: Any) -> Collaborator:
        load_profiles(
            entries=[
                {
                    "name": f"p-{name}",
                    "role": name.title(),
                    "model": model,
                    "fallback_models": fallback or [],
                    "tools": ["get_collaborators", "ask_agent", "reply", "cancel_request", "ask_human", "delegate",
                              "finish"],
                    **profile,
                }
            ]
        )  # fmt: skip
        collaborator, _ = actions.add_agent(
            saga=saga, name=name, role=name.title(), task=f"{name}'s task", runtime="internal", profile=f"p-{name}",
            by=alice,
        )  # fmt: skip
        return collaborator

    return add


@pytest.fixture
def default_brain(transactional_db: None) -> None:
    load_profiles(entries=json.loads(BRAIN_PROFILES.read_text()))
    load_brains(entries=json.loads(BRAINS.read_text()))


@pytest.fixture
def fake_brain(transactional_db: None) -> None:
    """A brain whose every role runs on the fake OpenAI-compatible server, without fallbacks."""
    load_profiles(
        entries=[
            {"name": f"f-{role}", "role": role.title(), "model": model, "tools": ["finish"], "max_turns": 4}
            for role, model in FAKE_MODELS.items()
        ]
    )
    load_brains(
        entries=[
            {
                "name": "fake",
                "planner_profile": "f-router",
                "roles": {role: f"f-{role}" for role in FAKE_MODELS if role != "router"},
                "signals": {"coder": ["implement"], "tester": [r"\btests?\b"], "writer": ["changelog"]},
                "default_primary": "coder",
                "review_policy": "blocked",
            }
        ]
    )


@pytest.fixture
def client_for() -> Callable[[User], APIClient]:
    def make(user: User) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        return client

    return make
