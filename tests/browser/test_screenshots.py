"""Screenshots of a busy saga's page and inbox in the real Chromium.

Saved into the test's artifacts folder on every run; `AGORA_UPDATE_DOCS=1` also writes them to
docs/saga-page.png and docs/inbox.png, the pictures the README shows.
"""

import os
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

from accounts.models import User
from journal.actions import record
from sagas import actions
from sagas.models import Collaborator, Saga
from tests.browser.conftest import Browse, django_calls
from tests.sagas.kernel import profile_named

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def busy_saga(alice: User, bob: User) -> tuple[Saga, str]:
    """A saga mid-flight: a small team in every state, requests open and finished, workers, a
    steering message, an answered form and one waiting for alice. Returns it and that form's id."""
    saga = actions.create_saga(
        title="Billing API v2 migration",
        goal="Move every billing client to the v2 API without breaking anyone, and retire v1 by March.",
        owner=alice,
    )
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Client usage and deadlines", by=alice)

    def agent(name: str, role: str, task: str, parent: str | None = None, profile: str = "") -> Collaborator:
        runtime = Collaborator.Runtime.INTERNAL if profile else Collaborator.Runtime.EXTERNAL
        collaborator, _ = actions.add_agent(
            saga=saga, name=name, role=role, task=task, runtime=runtime, profile=profile, parent=parent, by=alice
        )
        return collaborator

    lead = agent("lead", "Lead", "Plan the migration and split the work.")
    coder = agent("coder", "Coder", "Port the invoice and refund endpoints to v2.", parent="agent:lead")
    reviewer = agent(
        "reviewer", "Reviewer", "Review each change for compatibility.", "agent:lead", profile=profile_named("reviewer")
    )
    scout = agent("scout", "Scout", "Find every client still calling v1.")
    agent("writer", "Writer", "Update the client migration guide once the endpoints land.", parent="agent:lead")

    def worker(who: Collaborator, **data: object) -> None:
        record(saga_id=saga.pk, type="worker_start", actor=who.handle, run_id=who.run.pk, data=data)

    def llm(who: Collaborator, model: str, tokens: tuple[int, int], tools: list[str]) -> None:
        data = {"model": model, "prompt_tokens": tokens[0], "completion_tokens": tokens[1], "tool_calls": tools}
        record(saga_id=saga.pk, type="llm_call", actor=who.handle, run_id=who.run.pk, data=data)

    worker(lead, role="Lead", task=lead.task)
    llm(lead, "gpt-4.1-mini", (1830, 240), ["delegate", "ask_agent"])
    actions.set_external_status(run_id=lead.run.pk, status="working", by=lead.user)
    worker(coder, role="Coder", task=coder.task)
    actions.set_external_status(run_id=coder.run.pk, status="working", by=coder.user)

    plan, _ = actions.ask_agent(
        sender=lead, to="agent:coder", type="code.plan", payload={"endpoints": ["/invoices", "/refunds"]}
    )
    actions.reply_to_request(request_id=plan.pk, by=coder.user, payload={"steps": 4, "risk": "low"})
    usage, _ = actions.ask_agent(sender=lead, to="agent:scout", type="research.usage", payload={"api": "v1"})
    worker(scout, role="Scout", task=scout.task)
    record(saga_id=saga.pk, type="model_fallback", actor=scout.handle, run_id=scout.run.pk,
           data={"role": "Scout", "model": "gpt-4.1", "error_class": "rate_limit"})  # fmt: skip
    llm(scout, "gpt-4.1-mini", (2210, 410), ["ask_human"])
    answered, _ = actions.ask_human(
        asker=scout, to="human:bob", title="Which clients matter most?",
        fields=[{"name": "clients", "label": "Top clients", "type": "textarea"}],
    )  # fmt: skip
    actions.answer_human_request(human_request_id=answered.pk, answer={"clients": "Acme, Globex"}, by=bob)
    actions.reply_to_request(request_id=usage.pk, by=scout.user, payload={"clients_on_v1": 17})
    actions.finish_run(run=scout.run, status="completed", result="17 clients still on v1")
    summary = "17 clients still on v1; Acme and Globex first."
    record(saga_id=saga.pk, type="worker_end", actor=scout.handle, run_id=scout.run.pk,
           data={"status": "completed", "result": summary, "error": ""})  # fmt: skip

    # the reviewer's turn: it asks the coder for the diff and parks on the answer
    run = actions.claim_turn(run_id=reviewer.run.pk)
    assert run is not None
    worker(reviewer, role="Reviewer", task=reviewer.task)
    llm(reviewer, "gpt-4.1-mini", (1420, 96), ["ask_agent"])
    diff, _ = actions.ask_agent(
        sender=reviewer, to="agent:coder", type="code.review", payload={"pr": 482, "files": 9}, mode="wait",
        timeout_s=240,
    )  # fmt: skip
    actions.park_on_request(run=run, turn=run.turn, request_id=diff.pk, tool_call_id="call-1")
    actions.end_turn(run=run, turn=run.turn, more=False)
    actions.steer(saga=saga, to=coder, message="Keep v1 responses byte-identical for Acme.", by=alice)
    waiting, _ = actions.ask_human(
        asker=lead,
        title="Approve the cut-over plan",
        fields=[
            {"name": "decision", "label": "Decision", "type": "choice", "choices": ["approve", "revise", "reject"]},
            {"name": "cutover", "label": "Cut-over date", "type": "date"},
            {"name": "clients", "label": "Clients to migrate first", "type": "integer"},
            {"name": "notify", "label": "Email the clients?", "type": "boolean"},
            {"name": "notes", "label": "Notes for the team", "type": "textarea", "required": False},
        ],
    )
    return saga, waiting.pk


def test_screenshots_of_the_saga_page_and_the_inbox(browse: Browse, alice: User, bob: User, artifacts: Path) -> None:
    with django_calls():
        saga, form_id = busy_saga(alice, bob)
    page = browse.as_user(alice)
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.goto(f"/sagas/{saga.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    for state in ("working", "waiting", "idle", "finished"):
        expect(page.locator(f'#part-roster [data-roster="{state}"] li[data-handle]')).not_to_have_count(0)
    expect(page.locator("#part-workers [data-worker]")).to_have_count(4)
    expect(page.locator("#part-requests tr[data-request]")).to_have_count(3)
    page.evaluate("document.querySelectorAll('.is-new').forEach(e => e.classList.remove('is-new'))")
    page.screenshot(path=str(artifacts / "saga-page.png"), full_page=True, animations="disabled")

    # the inbox, after a first try with a wrong value
    card = page.locator(f'[data-form-id="{form_id}"]')
    card.get_by_label("approve").check()
    card.get_by_label("Cut-over date").fill("2026-03-02")
    card.get_by_label("Clients to migrate first").fill("a few")
    card.get_by_role("button", name="Send answer").click()
    card = page.locator(f'[data-form-id="{form_id}"]')
    expect(card.locator('[data-field="clients"] .field-error')).to_have_text("Enter a whole number.")
    expect(card.locator('[data-field="notify"] .field-error')).to_have_text("This field is required.")
    page.locator("#inbox").screenshot(path=str(artifacts / "inbox.png"), animations="disabled")

    page.goto("/")
    expect(page.locator("#waiting")).to_contain_text("Approve the cut-over plan")
    page.screenshot(path=str(artifacts / "saga-list.png"))

    if os.environ.get("AGORA_UPDATE_DOCS") == "1":
        DOCS.mkdir(exist_ok=True)
        for name in ("saga-page.png", "inbox.png"):
            shutil.copyfile(artifacts / name, DOCS / name)
