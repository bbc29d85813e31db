"""The prompt box and the live plan view in a real Chromium against the real app."""

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from accounts.models import User
from agents.actions import load_profiles
from agents.orchestrator.actions import load_brains
from sagas import actions
from sagas.models import Saga
from tests.browser.conftest import Browse, django_calls
from tests.support import CeleryWorker

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = Path(__file__).resolve().parents[2] / "agents"


@pytest.fixture
def saga(alice: User) -> Saga:
    load_profiles(entries=json.loads((AGENTS / "profiles" / "brain.json").read_text()))
    load_brains(entries=json.loads((AGENTS / "brains" / "default.json").read_text()))
    return actions.create_saga(title="Cursor pagination", goal="Ship it.", owner=alice)


def test_the_prompt_box_and_the_plan_view_updating_live(
    browse: Browse, alice: User, saga: Saga, redis_url: str, artifacts: Path
) -> None:
    page = browse.as_user(alice)
    page.goto(f"/sagas/{saga.pk}/")
    page.get_by_role("textbox", name="Prompt").fill("Migrate GET /v2/orders to cursor pagination, with tests and docs.")
    page.get_by_role("button", name="Ask the Brain").click()

    # No Celery worker yet: the page shows the prompt planning, and stays open while it runs.
    plan = page.locator("#part-prompts article.plan-view")
    expect(plan).to_have_attribute("data-status", "running")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.evaluate("window.sameDocument = true")

    with django_calls():
        worker = CeleryWorker(redis_url, artifacts)
    try:
        for role in ("researcher", "tester", "writer"):
            expect(plan.locator(f'[data-role="{role}"]')).to_have_attribute("data-status", "completed", timeout=60_000)
        expect(plan).to_have_attribute("data-status", "completed", timeout=60_000)
        expect(plan.locator('[data-step="review"]')).to_have_attribute("data-decision", "approve")
        expect(plan.locator('[data-step="primary"]')).to_contain_text("opaque cursor")
        # The review's confidence under its decision, then the final answer with the review merged in.
        expect(plan.locator('[data-step="review"] [data-confidence]')).to_have_text("confidence 0.80")
        expect(plan.locator('[data-step="final"]')).to_contain_text("opaque cursor")
        expect(plan.locator('[data-step="final"]')).to_contain_text("Review: approve")
        expect(plan.locator('[data-role="tester"]')).to_contain_text("Twelve cases")
        assert page.evaluate("window.sameDocument") is True  # updated in place, never reloaded
        page.locator("#prompts").screenshot(path=str(artifacts / "plan-view.png"))  # for a person to look at
    finally:
        worker.kill()
