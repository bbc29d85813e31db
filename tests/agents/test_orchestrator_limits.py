"""A step given input past the kernel's limits, or odd but valid model output, still moves the prompt:
it delegates within the limits, or fails the prompt with the reason. It never stays `running` for the
periodic resume to try the same again forever. Steps are advanced in this process. And a brains file
of the wrong shape is refused with the brain it names, not a traceback."""

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.models import User
from agents.orchestrator import actions as orchestrator
from agents.orchestrator import steps
from agents.orchestrator.actions import submit_prompt
from agents.orchestrator.models import Brain, Prompt
from sagas import actions
from sagas.models import Collaborator, Run, Saga

pytestmark = pytest.mark.usefixtures("fake_brain", "inline_hooks")


@pytest.fixture
def inline_hooks(settings: LazySettings) -> None:
    settings.AGORA_HOOKS_INLINE = True


def at_step(saga: Saga, alice: User, step: str, **fields: Any) -> Prompt:
    """A prompt moved to `step` as if the steps before it had run."""
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake")
    plan = {"primary_role": "coder", "workers": [], "requires_review": True, "reason": "", "source": "router"}
    Prompt.objects.filter(pk=prompt.pk).update(step=step, plan=fields.pop("plan", plan), **fields)
    return prompt


def finished(prompt: Prompt, slot: str, role: str, result: Any) -> None:
    """The worker in `slot` delegated by the prompt's lead, and finished with `result`."""
    lead = prompt.lead
    assert lead is not None
    worker, _ = actions.add_agent(
        saga=lead.saga, name=prompt.worker_name(slot), role=role, task="t", runtime="internal", profile=f"f-{role}",
        parent=lead.handle, by=lead.user, ring=False,
    )  # fmt: skip
    actions.finish_run(run=Run.objects.get(collaborator=worker), status="completed", result=result)


def advanced(prompt: Prompt) -> Prompt:
    steps.advance(str(prompt.pk))
    return Prompt.objects.get(pk=prompt.pk)


def task_of(prompt: Prompt, slot: str) -> str:
    return Collaborator.objects.get(saga=prompt.saga, name=prompt.worker_name(slot)).task


def test_a_long_request_still_delegates_its_workers_within_the_limit(
    saga: Saga, alice: User, settings: LazySettings
) -> None:
    limit = settings.AGORA_MAX_GOAL_CHARS
    # A request the API accepts (at most 20,000 characters), which each worker's task holds twice.
    text = "Implement the cursor. " + "x" * (limit - 100)
    prompt, _ = submit_prompt(saga=saga, by=alice, text=text, brain="fake", team=["tester", "writer"])

    after = advanced(prompt)

    assert (after.status, after.step) == ("running", "workers")
    for role in ("tester", "writer"):
        task = task_of(prompt, role)
        assert len(task) <= limit and "Implement the cursor." in task and "characters cut]" in task
        assert f"task:{prompt.pk}:{role}" in task  # the handoff's ids and the answer's shape are whole


def test_long_results_and_a_long_answer_still_delegate_the_primary_and_the_reviewer(
    saga: Saga, alice: User, settings: LazySettings
) -> None:
    limit = settings.AGORA_MAX_GOAL_CHARS
    plan = {"primary_role": "coder", "requires_review": True, "reason": "", "source": "router",
            "workers": [{"role": "tester", "goal": "Test it.", "reason": ""},
                        {"role": "writer", "goal": "Write it up.", "reason": ""}]}  # fmt: skip
    prompt = at_step(saga, alice, "workers", plan=plan)
    finished(prompt, "tester", "tester", {"summary": "t" * limit})
    finished(prompt, "writer", "writer", {"summary": "w" * limit})

    after = advanced(prompt)
    assert (after.status, after.step) == ("running", "primary")
    primary_task = task_of(prompt, "primary")
    assert len(primary_task) <= limit and "### tester" in primary_task and "### writer" in primary_task
    assert after.results[0]["summary"] == "t" * limit  # the result itself is kept whole

    finished_run = Run.objects.get(collaborator__saga=saga, collaborator__name=prompt.worker_name("primary"))
    actions.finish_run(run=finished_run, status="completed", result="A" * (limit + 1000))
    after = advanced(prompt)
    assert (after.status, after.step, len(after.answer)) == ("running", "review", limit + 1000)
    assert len(task_of(prompt, "review")) <= limit


def test_a_delegation_the_kernel_refuses_fails_the_prompt_with_the_reason(
    saga: Saga, alice: User, settings: LazySettings
) -> None:
    settings.AGORA_MAX_AGENTS_PER_SAGA = 2  # the lead fits, its two workers do not
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake", team=["tester", "writer"])

    after = advanced(prompt)

    assert (after.status, after.step) == ("failed", "done")
    assert after.reason.startswith("The routing step was refused: ") and "agents" in after.reason
    assert not Collaborator.objects.filter(saga=saga, name__startswith=f"{prompt.lead_name}.").exists()
    assert Run.objects.get(collaborator__name=prompt.lead_name, collaborator__saga=saga).status == "failed"
    assert saga.journal_events.filter(type="prompt.failed").count() == 1


def test_a_step_that_raises_fails_the_prompt_and_hands_back_no_run(
    saga: Saga, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = steps.Here.claim

    def claim_then_raise(here: steps.Here, run_id: str) -> None:
        claim(here, run_id)
        raise RuntimeError("a bug, after the reviewer's run was claimed in the step's transaction")

    prompt = at_step(saga, alice, "primary", results=[])
    finished(prompt, "primary", "coder", "The answer.")
    monkeypatch.setattr(steps.Here, "claim", claim_then_raise)

    handed = steps.advance(str(prompt.pk))

    after = Prompt.objects.get(pk=prompt.pk)
    assert (after.status, after.step, handed) == ("failed", "done", [])  # no claim of a rolled-back run
    assert after.reason == "The primary step failed (RuntimeError); the worker's log has the details."
    assert not Collaborator.objects.filter(saga=saga, name=prompt.worker_name("review")).exists()


@pytest.mark.parametrize(
    "review",
    [
        {"decision": "approve", "findings": None, "confidence": 10**400},
        {"decision": "approve", "findings": 3, "confidence": True},
        '{"decision": "approve", "confidence": 1e999}',  # valid JSON; Python reads it as infinity
    ],
)
def test_a_review_with_odd_fields_is_read_not_raised_on(saga: Saga, alice: User, review: Any) -> None:
    prompt = at_step(saga, alice, "review", answer="The answer.", results=[])
    finished(prompt, "review", "review", review)

    after = advanced(prompt)

    assert (after.status, after.step) == ("completed", "done")
    assert after.review is not None
    assert (after.review["decision"], after.review["confidence"], after.review["findings"]) == ("approve", 0.0, [])


def test_deeply_nested_json_from_a_worker_is_its_text(saga: Saga, alice: User) -> None:
    nested = "[" * 5000 + "]" * 5000  # deeper than Python's JSON decoder goes
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake", team=["tester", "writer"])
    advanced(prompt)
    for role, result in (("tester", nested), ("writer", {"risks": ["none found"]})):
        run = Run.objects.get(collaborator__saga=saga, collaborator__name=prompt.worker_name(role))
        actions.finish_run(run=run, status="completed", result=result)

    after = advanced(prompt)

    assert (after.status, after.step) == ("completed", "done")
    assert [(r["role"], r["summary"]) for r in after.results] == [("tester", nested), ("writer", "")]


def test_a_key_that_a_concurrent_submission_used_first_replays_it(
    saga: Saga, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL two submissions with one key at once both miss the other's row until the first
    commits; the second's insert then fails on the key's unique index. Here the second's look-up is
    made to miss it."""
    first, _ = submit_prompt(saga=saga, by=alice, text="Do it", brain="fake", idempotency_key="k1")
    looked = orchestrator.first_prompt
    misses = iter([True])
    monkeypatch.setattr(
        orchestrator, "first_prompt", lambda *args: None if next(misses, False) else looked(*args)
    )  # fmt: skip

    again, created = submit_prompt(saga=saga, by=alice, text="Do it", brain="fake", idempotency_key="k1")

    assert (again.pk, created) == (first.pk, False)
    assert Prompt.objects.filter(saga=saga).count() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"roles": {"coder\n": "f-coder"}},  # a role name with a newline: no worker could be named after it
        {"signals": ["implement"]},
        {"planner_profile": ["f-router"]},
        {"roles": {"coder": ["f-coder"]}},
        {"default_primary": ["coder"]},
    ],
)
def test_a_brains_file_of_the_wrong_shape_is_refused_by_name(tmp_path: Path, change: dict[str, Any]) -> None:
    brain = {"name": "odd", "planner_profile": "f-router", "roles": {"coder": "f-coder"}, "default_primary": "coder"}
    file = tmp_path / "brains.json"
    file.write_text(json.dumps([{**brain, **change}]))

    with pytest.raises(CommandError, match="Brain 'odd'"):
        call_command("load_brains", str(file))
    assert not Brain.objects.filter(name="odd").exists()
