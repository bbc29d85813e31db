"""The saga page's prompt box and plan view, server-rendered (readable without JavaScript), and the
live part the page's script re-fetches."""

import json
import re

from django.conf import LazySettings
from django.test import Client

from accounts.models import User
from agents.orchestrator.models import Prompt
from config.params import FORM_SENT
from sagas import actions
from sagas.models import Saga
from tests.agents.fake_llm import FakeLLM, say
from tests.agents.orchestration_support import page_client
from tests.support import CeleryWorker, wait_until


def test_the_prompt_box_starts_an_orchestration_and_the_plan_view_shows_it(
    worker: CeleryWorker, default_brain: None, saga: Saga, alice: User
) -> None:
    client = page_client(alice)
    page = client.get(f"/sagas/{saga.pk}/").content.decode()
    assert 'id="prompt-form"' in page and "No prompt yet." in page

    response = client.post(f"/sagas/{saga.pk}/prompts/", {"prompt": "Migrate the orders API to a cursor."})
    assert response.status_code == 302 and response["Location"].endswith(f"/sagas/{saga.pk}/#prompts")
    prompt = Prompt.objects.get(saga=saga)
    wait_until(lambda: Prompt.objects.get(pk=prompt.pk).status == "completed", timeout=60, what="the orchestration")

    for html in (client.get(f"/sagas/{saga.pk}/").content.decode(),
                 client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()):  # fmt: skip
        assert f'data-prompt="{prompt.pk}" data-status="completed"' in html
        for role in ("researcher", "tester", "writer"):
            assert f'data-role="{role}" data-status="completed"' in html
        assert "Twelve cases" in html  # the tester's summary
        assert 'data-step="primary" data-status="completed"' in html and "opaque cursor" in html
        assert 'data-decision="approve"' in html
        assert 'data-confidence="0.80"' in step(html, "review")
        assert "opaque cursor" in step(html, "final") and "Review: approve" in step(html, "final")
    # After the saga ends (no action ends one yet: its row is set), the plan view stays; the box goes.
    Saga.objects.filter(pk=saga.pk).update(status=Saga.Status.COMPLETED)
    html = client.get(f"/sagas/{saga.pk}/").content.decode()
    assert f'data-prompt="{prompt.pk}" data-status="completed"' in html and 'id="prompt-form"' not in html
    # The panel says which journal events refresh it.
    assert (
        'data-events="prompt.,plan.,primary.,review.,worker_,run.,hook_"'
        in client.get(f"/sagas/{saga.pk}/").content.decode()
    )


def test_a_hook_outcome_refreshes_the_panel_and_the_plan_view_shows_it(
    default_brain: None, saga: Saga, alice: User
) -> None:
    """The page's script re-fetches a panel when an event's type starts with one of the prefixes
    it names (static/agora/saga.js, `partsFor`): a stored hook outcome's event must match, and the
    re-fetched part must show the outcome."""
    from django.conf import settings

    from agents.hooks.events import RULES, Event
    from agents.hooks.execution import Raw
    from agents.hooks.lifecycle import hook_key
    from agents.hooks.models import HookHandler
    from agents.hooks.parsing import Verdict
    from agents.hooks.runner import store
    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.plans import forced_plan
    from journal.models import JournalEvent

    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement the cursor, with a changelog.")
    # Routed, its writer refused by its SubagentStart hook, the workers step not reached yet.
    Prompt.objects.filter(pk=prompt.pk).update(plan=forced_plan(["writer"]), step=Prompt.Step.WORKERS)
    handler = HookHandler(name="no-writer", event=Event.SUBAGENT_START, type="command", trusted=True)
    store(
        saga_id=saga.pk, key=hook_key(prompt.pk, Event.SUBAGENT_START, "writer"), event=Event.SUBAGENT_START,
        handler=handler, role="writer", raw=Raw(duration_ms=12),
        verdict=Verdict("blocked", reason="Writers are on leave."),
    )  # fmt: skip

    *_, prefixes = settings.AGORA_SAGA_PANELS["prompts"]
    event = JournalEvent.objects.filter(saga=saga).latest("seq")
    assert event.type == "hook_subagent_start" and any(event.type.startswith(p) for p in prefixes)
    # Every hook event (and every orchestration event) refreshes the panel.
    types = [r.journal_type for r in RULES.values()] + [
        "prompt.submitted", "plan.created", "worker_start", "worker_end", "primary.completed", "review.completed",
        "prompt.completed", "prompt.blocked", "prompt.failed",
    ]  # fmt: skip
    assert [t for t in types if not any(t.startswith(p) for p in prefixes)] == []
    html = page_client(alice).get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert 'data-hook="no-writer" data-event="SubagentStart" data-status="blocked"' in html
    assert "SubagentStart (writer) <code>no-writer</code> blocked: Writers are on leave." in html
    # The plan view shows the worker blocked at once, from the hook's outcome.
    assert 'data-role="writer" data-status="blocked"' in html and "blocked by a hook: Writers are on leave." in html


def test_the_plan_view_shows_the_review_in_full_then_the_final_answer(
    default_brain: None, saga: Saga, alice: User
) -> None:
    from agents.hooks.lifecycle import FEEDBACK_HEADING
    from agents.orchestrator import handoffs
    from agents.orchestrator.actions import submit_prompt

    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement the cursor.")
    plan = {"primary_role": "coder", "workers": [], "requires_review": True, "source": "router", "reason": "code"}
    # The primary has answered, the review is under way: no final answer yet.
    Prompt.objects.filter(pk=prompt.pk).update(plan=plan, step=Prompt.Step.REVIEW, answer="Use an opaque cursor.")
    client = page_client(alice)
    html = client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert "Use an opaque cursor." in step(html, "primary") and 'data-step="final"' not in html

    review = handoffs.gate_review(
        {"decision": "blocked", "confidence": 0.65, "blocking_issues": ["Tampered cursors are accepted."],
         "required_changes": ["Sign the cursor.", "Document the 400."], "residual_risks": ["partner sync"]},
        [], policy="blocked",
    )  # fmt: skip
    final = f"{handoffs.merge_review('Use an opaque cursor.', review)}\n\n{FEEDBACK_HEADING}\nCite the changelog."
    Prompt.objects.filter(pk=prompt.pk).update(
        step=Prompt.Step.DONE, status=Prompt.Status.BLOCKED, review=review, final_answer=final,
        reason="Tampered cursors are accepted.",
    )  # fmt: skip
    for html in (client.get(f"/sagas/{saga.pk}/").content.decode(),
                 client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()):  # fmt: skip
        # prompt → primary (its own answer) → review (decision, confidence, what blocks, what to change) → final
        assert html.index('data-step="primary"') < html.index('data-step="review"') < html.index('data-step="final"')
        primary = step(html, "primary")
        assert "Use an opaque cursor." in primary and "Review: blocked" not in primary
        reviewed = step(html, "review")
        assert 'data-decision="blocked"' in html and 'data-confidence="0.65">confidence 0.65<' in reviewed
        assert "<ul><li>Tampered cursors are accepted.</li></ul>" in reviewed.split("data-blocking", 1)[1]
        assert "<ul><li>Sign the cursor.</li><li>Document the 400.</li></ul>" in reviewed.split("data-required", 1)[1]
        answered = step(html, "final")
        assert "Use an opaque cursor.<br><br>Review: blocked<br>- required: Sign the cursor." in answered
        assert "- blocking: Tampered cursors are accepted.<br>- risk: partner sync</div>" in answered
        assert "feedback from hooks: Cite the changelog." in answered and FEEDBACK_HEADING not in html

    # A prompt that ended without a final answer shows the primary's as its answer.
    Prompt.objects.filter(pk=prompt.pk).update(final_answer="", status=Prompt.Status.COMPLETED)
    html = client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert ">Use an opaque cursor.</div>" in step(html, "final") and "data-feedback" not in html


def step(html: str, name: str) -> str:
    """One step of the (first) plan view, up to the next step."""
    return html.split(f'data-step="{name}"', 1)[1].split("data-step=", 1)[0].split("</ol>", 1)[0]


def test_the_plan_view_shows_each_workers_goal_and_reason_and_why_the_router_was_not_followed(
    model_here: FakeLLM, fake_brain: None, saga: Saga, alice: User, settings: LazySettings
) -> None:
    """Two prompts routed in this process: one the router planned (its goals and reasons), one whose
    router answered garbage (the heuristic's plan, and the router's error)."""
    from django.utils.html import escape

    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the routing step runs hooks (none here), in this process
    routed = {"primary_role": "coder", "requires_review": True, "reason": "Code first.",
              "workers": [{"role": "tester", "goal": "Cover the empty last page.", "reason": "It asks for tests."},
                          {"role": "writer", "goal": "Draft the changelog entry.", "reason": ""}]}  # fmt: skip
    model_here.script("router-m", say(json.dumps(routed)), say("Sure! The coder should take this one."))
    planned, _ = submit_prompt(saga=saga, by=alice, text="Implement the cursor, with tests.", brain="fake")
    steps.advance(str(planned.pk))
    guessed, _ = submit_prompt(saga=saga, by=alice, text="Implement the cursor, with a changelog.", brain="fake")
    steps.advance(str(guessed.pk))
    heuristic = Prompt.objects.get(pk=guessed.pk).plan
    assert heuristic is not None and "not a JSON object" in heuristic["router_error"]

    client = page_client(alice)
    for html in (client.get(f"/sagas/{saga.pk}/").content.decode(),
                 client.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()):  # fmt: skip
        followed, fell_back = plan_view_of(html, planned), plan_view_of(html, guessed)
        tester, writer = worker_of(followed, "tester"), worker_of(followed, "writer")
        assert '<div class="worker-goal">Cover the empty last page.</div>' in tester
        assert "why: It asks for tests." in tester
        assert '<div class="worker-goal">Draft the changelog entry.</div>' in writer and "why:" not in writer
        assert "data-router-error" not in followed
        (shown,) = re.findall(r"<p [^>]*data-router-error>(.*?)</p>", fell_back)
        assert shown == f"router fell back to the heuristic: {escape(heuristic['router_error'])}"
        (worker,) = heuristic["workers"]
        assert worker["role"] == "writer" and worker["reason"] == "signals: changelog"
        assert f'<div class="worker-goal">{escape(worker["goal"])}</div>' in worker_of(fell_back, "writer")
        assert "why: signals: changelog" in worker_of(fell_back, "writer")


def test_the_plan_view_names_the_roles_whose_signals_ran_out_of_time(
    model_here: FakeLLM, fake_brain: None, saga: Saga, alice: User, settings: LazySettings
) -> None:
    """A signal that backtracks without end on the prompt counts as no match, and the page says whose."""
    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.models import Brain

    settings.AGORA_HOOKS_INLINE = True
    settings.AGORA_SIGNAL_TIMEOUT_S = 0.01
    Brain.objects.filter(name="fake").update(signals={"coder": ["implement"], "writer": [r"(\w|\w\w)+$"]})
    model_here.script("router-m", say("not a plan"))
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement " + "a" * 60 + "!", brain="fake")
    steps.advance(str(prompt.pk))

    html = plan_view_of(page_client(alice).get(f"/sagas/{saga.pk}/").content.decode(), prompt)
    (shown,) = re.findall(r"<p [^>]*data-signals-timed-out>(.*?)</p>", html)
    assert shown == "signals too slow to match this prompt, counted as no match: writer"


def plan_view_of(html: str, prompt: Prompt) -> str:
    return html.split(f'data-prompt="{prompt.pk}"', 1)[1].split("</article>", 1)[0]


def worker_of(view: str, role: str) -> str:
    return view.split(f'data-role="{role}"', 1)[1].split("</li>", 1)[0]


def test_people_who_do_not_manage_get_no_prompt_box_and_cannot_submit(
    default_brain: None, saga: Saga, alice: User, bob: User, mallory: User
) -> None:
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Watch", by=alice)
    page = page_client(bob).get(f"/sagas/{saga.pk}/").content.decode()
    assert 'id="prompts"' in page and 'id="prompt-form"' not in page
    assert page_client(bob).post(f"/sagas/{saga.pk}/prompts/", {"prompt": "Do it"}).status_code == 403
    assert page_client(mallory).post(f"/sagas/{saga.pk}/prompts/", {"prompt": "Do it"}).status_code == 404
    assert not Prompt.objects.exists()


def test_a_rejected_prompt_says_why(default_brain: None, saga: Saga, alice: User) -> None:
    client = page_client(alice)
    response = client.post(f"/sagas/{saga.pk}/prompts/", {"prompt": "   "}, follow=True)
    assert "Prompt not submitted" in response.content.decode()
    assert not Prompt.objects.exists()


def test_the_prompt_box_sent_twice_starts_one_orchestration(default_brain: None, saga: Saga, alice: User) -> None:
    client = page_client(alice)
    key = prompt_key(client, saga)
    form = {"prompt": "Migrate the orders API to a cursor.", "idempotency_key": key}
    for _ in range(2):  # a double click
        assert client.post(f"/sagas/{saga.pk}/prompts/", form).status_code == 302
    assert Prompt.objects.filter(saga=saga).count() == 1
    # The same rendered form back with other text (the browser's back button) is refused, and says so.
    response = client.post(f"/sagas/{saga.pk}/prompts/", {**form, "prompt": "Something else."}, follow=True)
    assert FORM_SENT in response.content.decode() and Prompt.objects.filter(saga=saga).count() == 1
    # A freshly rendered form is a new prompt; so is a form without a key (or one not rendered here).
    fresh = prompt_key(client, saga)
    assert fresh != key
    client.post(f"/sagas/{saga.pk}/prompts/", {**form, "idempotency_key": fresh})
    client.post(f"/sagas/{saga.pk}/prompts/", {**form, "idempotency_key": "not-ours"})
    assert Prompt.objects.filter(saga=saga).count() == 3


def prompt_key(client: Client, saga: Saga) -> str:
    """The one-time key of the prompt box on the saga's page, freshly rendered."""
    page = client.get(f"/sagas/{saga.pk}/").content.decode()
    found = re.search(r'id="prompt-form".*?name="idempotency_key" value="([0-9a-f]{32})"', page, re.S)
    assert found is not None
    return found[1]
