"""prepare_prompt: SessionStart sees the raw prompt, references expand, UserPromptSubmit sees the
expanded prompt; blocks end it there; contexts are appended; a retry runs no handler twice."""

import json
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import User
from agents.actions import load_profiles
from agents.hooks import Event, hook_key, prepare_prompt, run_hooks
from agents.hooks.actions import load_hooks
from agents.orchestrator import hooking, reads
from agents.orchestrator.actions import load_brains, submit_prompt
from sagas import actions
from sagas.models import Saga
from tests.agents.hooks_support import command
from tests.agents.orchestration_support import BRAIN_PROFILES, BRAINS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def inline(settings: LazySettings) -> None:
    settings.AGORA_HOOKS_INLINE = True


@pytest.fixture
def saga(alice: User) -> Saga:
    saga = actions.create_saga(title="Hooked", goal="Order of things", owner=alice)
    actions.add_artifact(saga=saga, name="spec.md", content=b"Only /v2.", content_type="text/plain", by=alice)
    return saga


def test_session_start_sees_the_raw_prompt_and_user_prompt_submit_the_expanded_one(
    saga: Saga, alice: User, tmp_path: Path
) -> None:
    start, submit = tmp_path / "start.json", tmp_path / "submit.json"
    load_hooks(
        entries=[
            command("start", "SessionStart", "--stdin-to", str(start), "--print", "Repo: agora."),
            command("submit", "UserPromptSubmit", "--stdin-to", str(submit), "--print",
                    json.dumps({"additional_context": "Freeze starts Friday."})),
        ]
    )  # fmt: skip

    prepared = prepare_prompt(saga=saga, user=alice, prompt_id="p1", text="Follow @artifact:spec.md")

    assert json.loads(start.read_text())["prompt"] == "Follow @artifact:spec.md"
    expanded = "Follow @artifact:spec.md\n\n--- @artifact:spec.md (text/plain, 9 bytes) ---\nOnly /v2."
    seen = json.loads(submit.read_text())
    assert seen["prompt"] == expanded and seen["prompt_id"] == "p1" and seen["key"] == "prompt:p1:UserPromptSubmit"
    assert not prepared.blocked
    assert prepared.text == f"{expanded}\n\n--- Context from hooks ---\n\nRepo: agora.\n\nFreeze starts Friday."


def test_a_session_start_block_ends_the_prompt_before_any_expansion(saga: Saga, alice: User, tmp_path: Path) -> None:
    submit = tmp_path / "submit.json"
    load_hooks(
        entries=[
            command("gate", "SessionStart", "--print", json.dumps({"decision": "block", "reason": "Outside hours."})),
            command("submit", "UserPromptSubmit", "--stdin-to", str(submit)),
        ]
    )

    # The reference names nothing, and yet nothing is refused: expansion never ran.
    prepared = prepare_prompt(saga=saga, user=alice, prompt_id="p1", text="Use @artifact:missing.md")

    assert prepared.blocked and prepared.event == Event.SESSION_START
    assert (prepared.blocked_by, prepared.reason) == ("gate", "Outside hours.")
    assert not submit.exists()


def test_a_user_prompt_submit_block_and_a_retry_that_runs_nothing_again(
    saga: Saga, alice: User, tmp_path: Path
) -> None:
    count = tmp_path / "count"
    load_hooks(
        entries=[
            command("count", "SessionStart", "--count", str(count)),
            command("gate", "UserPromptSubmit", "--print", json.dumps({"decision": "block", "reason": "No."})),
        ]
    )

    first = prepare_prompt(saga=saga, user=alice, prompt_id="p1", text="Go")
    again = prepare_prompt(saga=saga, user=alice, prompt_id="p1", text="Go")

    assert first.blocked and first.event == Event.USER_PROMPT_SUBMIT and first.reason == "No."
    assert again == first and count.read_text() == "ran\n"
    assert hook_key("p1", Event.SUBAGENT_START, "coder") == "prompt:p1:SubagentStart:coder"


def test_a_step_reads_the_events_its_brain_has_handlers_for_with_the_prompt_and_asks_no_more(
    saga: Saga, alice: User
) -> None:
    load_profiles(entries=json.loads(BRAIN_PROFILES.read_text()))
    load_brains(entries=json.loads(BRAINS.read_text()))
    load_hooks(
        entries=[command("everyone", "Stop"), command("mine", "SubagentStop", brain="default"),
                 command("theirs", "SessionStart", brain="elsewhere")]
    )  # fmt: skip
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Write the changelog.")

    read = reads.read_prompt(str(prompt.pk))

    assert read is not None and read.hooked_events == {Event.STOP, Event.SUBAGENT_STOP}
    with CaptureQueriesContext(connection) as with_it:
        assert read.submitted_by == alice  # read with it too: routing expands references as they may
        assert read.lead is not None and read.lead.run.collaborator_id == read.lead.pk  # the last step ends it
    assert not with_it.captured_queries
    assert hooking.hooked(read, Event.SUBAGENT_STOP) and not hooking.hooked(read, Event.SUBAGENT_START)
    with CaptureQueriesContext(connection) as queries:
        prepared = prepare_prompt(
            saga=saga, user=alice, prompt_id=read.pk, text=read.text, brain="default", hooked=read.hooked_events
        )
    assert prepared.text == "Write the changelog." and not prepared.hooks[0].results
    assert not [q["sql"] for q in queries.captured_queries if "agents_hook" in q["sql"]]
    stop = run_hooks(saga_id=saga.pk, event=Event.STOP, payload={}, key="k", brain="default", hooked=read.hooked_events)
    assert [r.handler for r in stop.results] == ["everyone"]
