"""What a model, a hook or an artifact hands the orchestrator that no column stores as it is (a NUL,
half of an emoji, spelled as a JSON escape or raw) is kept with U+FFFD in its place: the prompt goes
on. And a step that fails ends what its prompt started. Advanced in this process, no worker."""

import json

import pytest
from django.conf import LazySettings

from accounts.models import User
from agents.hooks.actions import load_hooks
from agents.hooks.models import HookResult
from agents.orchestrator import steps
from agents.orchestrator.actions import load_brains, submit_prompt
from agents.orchestrator.models import Prompt
from agents.orchestrator.tasks import run_here
from sagas import actions
from sagas.models import Collaborator, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.agents.hooks_support import command

pytestmark = pytest.mark.usefixtures("fake_brain")


def through_the_tester(saga: Saga, alice: User, settings: LazySettings) -> Prompt:
    """A prompt with one forced role, the tester, advanced here until it rests."""
    settings.AGORA_HOOKS_INLINE = True
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Test it.", brain="fake", team=["tester"])
    run_here(steps.advance(str(prompt.pk), worker="w1@host"))
    prompt.refresh_from_db()
    return prompt


@pytest.mark.parametrize("escaped", [r"\u0000", r"\ud83d"], ids=["NUL", "half an emoji"])
def test_a_workers_json_that_spells_what_no_column_stores_is_kept_with_a_replacement(
    saga: Saga, alice: User, model_here: FakeLLM, settings: LazySettings, escaped: str
) -> None:
    result = '{"summary": "Tested: ' + escaped + ' seen.", "risks": ["none"]}'
    model_here.script("tester-m", say("", tool_call("finish", {"result": result})))
    prompt = through_the_tester(saga, alice, settings)
    assert prompt.status == Prompt.Status.COMPLETED, prompt.reason
    assert prompt.results[0]["summary"] == "Tested: \ufffd seen."


def test_a_hooks_context_cut_inside_an_emoji_is_kept_and_its_worker_goes_on(
    saga: Saga, alice: User, model_here: FakeLLM, settings: LazySettings
) -> None:
    load_hooks(entries=[command("ctx", "SubagentStart", "--print", r'{"additional_context": "Deploy blocked \ud83d"}')])
    model_here.script("tester-m", say("", tool_call("finish", {"result": "Tested."})))
    prompt = through_the_tester(saga, alice, settings)
    assert prompt.status == Prompt.Status.COMPLETED, prompt.reason
    assert HookResult.objects.get(handler="ctx").context == "Deploy blocked \ufffd"


def test_a_text_artifact_holding_a_nul_is_expanded_with_a_replacement(
    saga: Saga, alice: User, model_here: FakeLLM, settings: LazySettings
) -> None:
    actions.add_artifact(saga=saga, name="data.txt", content=b"id\x00name\n", content_type="text/plain", by=alice)
    model_here.script("tester-m", say("", tool_call("finish", {"result": "Tested."})))
    settings.AGORA_HOOKS_INLINE = True
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Check @artifact:data.txt", brain="fake", team=["tester"])
    run_here(steps.advance(str(prompt.pk), worker="w1@host"))
    prompt.refresh_from_db()
    assert prompt.status == Prompt.Status.COMPLETED, prompt.reason
    assert "id\ufffdname" in prompt.expanded and "\x00" not in json.dumps(prompt.plan)


def test_a_step_that_fails_ends_the_workers_its_prompt_left_at_work(
    saga: Saga, alice: User, model_here: FakeLLM, settings: LazySettings
) -> None:
    """A brain changed while its prompt runs (its primary's role renamed): the step that starts the
    primary fails the prompt with the reason, and the worker that answered in text (resting, idle)
    is ended with it rather than left waiting for a step that never comes."""
    plan = {"primary_role": "coder", "workers": [{"role": "tester"}], "requires_review": False}
    model_here.script("router-m", say(json.dumps(plan)))
    model_here.script("tester-m", say("Tested: all green."))  # an answer in text: its run rests, idle
    settings.AGORA_HOOKS_INLINE = True
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake")
    here = steps.advance(str(prompt.pk), worker="w1@host")
    brain = prompt.brain
    roles = {"developer" if role == "coder" else role: profile for role, profile in brain.roles.items()}
    load_brains(entries=[{"name": brain.name, "planner_profile": brain.planner_profile, "signals": {},
                          "roles": roles, "default_primary": "developer"}])  # fmt: skip
    run_here(here)  # the tester rests; its task tries the step that starts the primary
    prompt.refresh_from_db()
    assert prompt.status == Prompt.Status.FAILED
    assert "has no role coder any more" in prompt.reason
    tester = Collaborator.objects.select_related("run").get(saga=saga, name=prompt.worker_name("tester"))
    assert tester.run.status == "failed"
