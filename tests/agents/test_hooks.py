"""Hooks run in this process (AGORA_HOOKS_INLINE): every type, decision, failure and the journal.
test_hooks_worker.py runs them in real Celery workers, including across a crash."""

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings

from accounts.models import User
from agents.hooks import Event, HooksOutsideWorker, run_hooks
from agents.hooks.actions import load_hooks
from agents.hooks.models import HookResult
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Saga
from tests.agents.hooks_support import Hookbin, alive, command, hookbin, python, webhook
from tests.support import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def inline(settings: LazySettings) -> None:
    settings.AGORA_HOOKS_INLINE = True


@pytest.fixture
def saga(alice: User) -> Saga:
    return actions.create_saga(title="Hooked", goal="Policy from outside", owner=alice)


@pytest.fixture
def bin_() -> Iterator[Hookbin]:
    with hookbin() as server:
        yield server


def run(saga: Saga, event: Event, key: str = "k1", **options: Any) -> Any:
    options.setdefault("payload", {"prompt": "Ship the release"})
    return run_hooks(saga_id=saga.pk, event=event, key=key, **options)


def hook_events(saga: Saga) -> list[JournalEvent]:
    return list(JournalEvent.objects.filter(saga=saga, type__startswith="hook_").order_by("seq"))


BLOCK = json.dumps({"decision": "block", "reason": "No releases on Friday."})


def test_a_command_blocks_with_its_reason_and_the_outcome_is_journaled(saga: Saga) -> None:
    load_hooks(entries=[command("friday", "UserPromptSubmit", "--print", BLOCK)])

    outcome = run(saga, Event.USER_PROMPT_SUBMIT)

    assert outcome.blocked and outcome.reason == "No releases on Friday." and outcome.blocked_by == "friday"
    (event,) = hook_events(saga)
    assert event.type == "hook_user_prompt_submit" and event.actor == "hook:friday"
    assert event.data["handler"] == "friday" and event.data["decision"] == "block"
    assert event.data["reason"] == "No releases on Friday." and event.data["context_chars"] == 0
    assert event.data["duration_ms"] > 0 and event.data["key"] == "k1"


def test_the_command_gets_the_event_json_on_stdin_without_a_shell(saga: Saga, tmp_path: Path) -> None:
    seen = tmp_path / "event.json"
    # `$HOME` and `;` reach the command as they are: no shell expands or splits them.
    load_hooks(entries=[command("spy", "SubagentStart", "--stdin-to", str(seen), "--print", "$HOME; echo hi")])

    outcome = run(saga, Event.SUBAGENT_START, role="coder", brain="default")

    assert json.loads(seen.read_text()) == {
        "prompt": "Ship the release", "event": "SubagentStart", "saga": str(saga.pk), "key": "k1",
        "brain": "default", "role": "coder",
    }  # fmt: skip
    assert outcome.context == "$HOME; echo hi"


def test_plain_stdout_is_context_only_for_the_three_context_events(saga: Saga) -> None:
    for event in Event:
        load_hooks(entries=[command(f"say-{event.value.lower()}", event.value, "--print", "Tests live in tests/.")])

    context = {event: run(saga, event, key=f"k-{event}").context for event in Event}

    assert context == {
        Event.SESSION_START: "Tests live in tests/.",
        Event.USER_PROMPT_SUBMIT: "Tests live in tests/.",
        Event.SUBAGENT_START: "Tests live in tests/.",
        Event.SUBAGENT_STOP: "",
        Event.STOP: "",
    }
    ignored = {e.data["event"]: e.data["status"] for e in hook_events(saga)}
    assert ignored["Stop"] == ignored["SubagentStop"] == "ignored"
    assert {e.type for e in hook_events(saga)} == {
        "hook_session_start", "hook_user_prompt_submit", "hook_subagent_start", "hook_subagent_stop", "hook_stop",
    }  # fmt: skip


def test_stop_takes_json_context_as_feedback_and_cannot_block(saga: Saga) -> None:
    feedback = json.dumps({"additional_context": "Mention the changelog.", "decision": "block", "reason": "late"})
    load_hooks(entries=[command("feedback", "Stop", "--print", feedback)])

    outcome = run(saga, Event.STOP)

    assert not outcome.blocked and outcome.context == "Mention the changelog."
    (result,) = outcome.results
    assert result.status == HookResult.Status.OK and "Stop cannot block" in result.error


def test_subagent_stop_neither_blocks_nor_adds_context(saga: Saga) -> None:
    load_hooks(entries=[command("late", "SubagentStop", "--print", BLOCK)])

    outcome = run(saga, Event.SUBAGENT_STOP, role="coder")

    assert not outcome.blocked and outcome.context == ""
    assert outcome.results[0].status == HookResult.Status.IGNORED


def test_json_wins_over_plain_text_and_contexts_join_in_handler_order(saga: Saga) -> None:
    load_hooks(
        entries=[
            command("a-json", "SessionStart", "--print", json.dumps({"additional_context": "From JSON."})),
            command("b-text", "SessionStart", "--print", "From text."),
        ]
    )

    outcome = run(saga, Event.SESSION_START)

    assert outcome.context == "From JSON.\n\nFrom text."
    assert sorted(e.data["context_chars"] for e in hook_events(saga)) == [10, 10]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (("--print", BLOCK, "--exit", "3"), "exit status 3"),
        (("--print", '{"decision": "block"'), "unparsable JSON"),
        (("--print", '["block"]'), "not an object"),
        (("--print", '{"decision": "maybe"}'), "unknown decision"),
    ],
)
def test_a_failing_or_unparsable_command_is_journaled_and_ignored(
    saga: Saga, options: tuple[str, ...], error: str
) -> None:
    load_hooks(entries=[command("broken", "UserPromptSubmit", *options), command("fine", "UserPromptSubmit")])

    outcome = run(saga, Event.USER_PROMPT_SUBMIT)

    assert not outcome.blocked and outcome.context == ""
    broken = next(r for r in outcome.results if r.handler == "broken")
    assert broken.status == HookResult.Status.ERROR and error in broken.error
    assert {e.data["handler"]: e.data["status"] for e in hook_events(saga)} == {"broken": "error", "fine": "ok"}


def test_a_missing_program_is_an_error_not_a_crash(saga: Saga) -> None:
    entry = {**command("ghost", "SessionStart"), "argv": ["/nonexistent/hook"]}
    load_hooks(entries=[entry])

    (result,) = run(saga, Event.SESSION_START).results

    assert result.status == HookResult.Status.ERROR and "could not start" in result.error


def test_a_hanging_command_is_killed_at_its_timeout_with_what_it_started(saga: Saga, tmp_path: Path) -> None:
    pid_file, child_file = tmp_path / "pid", tmp_path / "child"
    options = ("--pid", str(pid_file), "--child", str(child_file), "--sleep", "60")
    load_hooks(entries=[command("hang", "SessionStart", *options, timeout_s=1)])

    outcome = run(saga, Event.SESSION_START)

    (result,) = outcome.results
    assert result.status == HookResult.Status.TIMED_OUT and "killed after 1 s" in result.error
    assert not outcome.blocked and outcome.context == ""
    assert not alive(int(pid_file.read_text()))
    # Its own child, in its process group, is killed with it.
    wait_until(lambda: not alive(int(child_file.read_text())), timeout=15, what="the child to die")
    assert hook_events(saga)[0].data["status"] == "timed_out"


def test_two_one_second_handlers_run_at_the_same_time(saga: Saga, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    load_hooks(
        entries=[
            command("first", "SubagentStart", "--sleep", "1", "--times", str(first)),
            command("second", "SubagentStart", "--sleep", "1", "--times", str(second)),
        ]
    )

    run(saga, Event.SUBAGENT_START, role="coder")

    (start1, end1), (start2, end2) = ([float(t) for t in f.read_text().split()] for f in (first, second))
    assert end1 - start1 >= 1 and end2 - start2 >= 1
    assert start1 < end2 and start2 < end1  # the two seconds overlapped


def test_a_webhook_gets_the_event_and_its_answer_counts(saga: Saga, bin_: Hookbin) -> None:
    bin_.reply = (200, BLOCK)
    load_hooks(entries=[webhook("policy", "SessionStart", bin_.url)])

    outcome = run(saga, Event.SESSION_START, payload={"prompt": "Deploy"})

    assert outcome.blocked and outcome.reason == "No releases on Friday."
    assert bin_.received == [
        {"prompt": "Deploy", "event": "SessionStart", "saga": str(saga.pk), "key": "k1", "brain": "", "role": ""}
    ]


def test_a_webhook_that_fails_or_hangs_is_ignored(saga: Saga, bin_: Hookbin) -> None:
    bin_.reply, bin_.delay = (200, BLOCK), 3
    load_hooks(entries=[webhook("slow", "SessionStart", bin_.url, timeout_s=0.5)])
    assert run(saga, Event.SESSION_START, key="slow").results[0].status == HookResult.Status.TIMED_OUT

    bin_.reply, bin_.delay = (500, BLOCK), 0
    outcome = run(saga, Event.SESSION_START, key="failing")
    assert not outcome.blocked and outcome.results[0].error == "HTTP 500"


def test_python_handlers_decide_and_their_crashes_and_hangs_are_ignored(saga: Saga) -> None:
    load_hooks(
        entries=[
            python("context", "SubagentStart", "add_context"),
            python("crash", "SubagentStart", "crash"),
            python("plain", "SubagentStart", "plain"),
            python("slow", "SubagentStart", "slow", timeout_s=0.5),
        ]
    )

    outcome = run(saga, Event.SUBAGENT_START, role="tester")

    assert not outcome.blocked
    assert outcome.context == "python saw SubagentStart for tester\n\nplain python context"
    statuses = {r.handler: (r.status, r.error) for r in outcome.results}
    assert statuses["crash"] == ("error", "ValueError: the handler's own bug")
    assert statuses["slow"][0] == "timed_out"


def test_a_python_handler_blocks(saga: Saga) -> None:
    load_hooks(entries=[python("policy", "UserPromptSubmit", "block")])

    outcome = run(saga, Event.USER_PROMPT_SUBMIT, payload={"prompt": "rm -rf /"})

    assert outcome.blocked and outcome.reason == "python policy refuses: rm -rf /"


def test_matchers_and_brains_choose_the_handlers(saga: Saga) -> None:
    load_hooks(
        entries=[
            python("everyone", "SubagentStart", "plain"),
            python("coders", "SubagentStart", "add_context", matcher="coder"),
            python("reviews", "SubagentStart", "add_context", matcher="rev.*"),
            python("other-brain", "SubagentStart", "block", brain="other"),
            python("my-brain", "SubagentStart", "add_context", brain="main", matcher="coder|tester"),
        ]
    )

    def ran(role: str, brain: str = "main") -> list[str]:
        outcome = run(saga, Event.SUBAGENT_START, key=f"{brain}-{role}", role=role, brain=brain)
        return [r.handler for r in outcome.results]

    assert ran("coder") == ["coders", "everyone", "main/my-brain"]
    assert ran("reviewer") == ["everyone", "reviews"]
    assert ran("tester", brain="other") == ["everyone", "other/other-brain"]
    assert ran("coder-2") == ["everyone"]  # a name matches whole, not as a prefix


def test_a_retried_run_returns_the_stored_outcome_without_running_handlers_again(saga: Saga, tmp_path: Path) -> None:
    count = tmp_path / "count"
    load_hooks(entries=[command("once", "SessionStart", "--count", str(count), "--print", "Context once.")])

    first = run(saga, Event.SESSION_START, key="prompt-1:SessionStart")
    again = run(saga, Event.SESSION_START, key="prompt-1:SessionStart")

    assert count.read_text() == "ran\n"
    assert again.as_dict() == first.as_dict() and again.context == "Context once."
    assert len(hook_events(saga)) == 1
    run(saga, Event.SESSION_START, key="prompt-2:SessionStart")  # another key runs again
    assert count.read_text() == "ran\nran\n"


def test_no_handler_no_outcome(saga: Saga) -> None:
    outcome = run(saga, Event.STOP)
    assert not outcome.blocked and outcome.context == "" and outcome.results == []
    assert hook_events(saga) == []


def test_hooks_refuse_to_run_outside_a_celery_task(saga: Saga, settings: LazySettings, tmp_path: Path) -> None:
    settings.AGORA_HOOKS_INLINE = False
    count = tmp_path / "count"
    load_hooks(entries=[command("never", "SessionStart", "--count", str(count))])

    with pytest.raises(HooksOutsideWorker):
        run(saga, Event.SESSION_START)
    assert not count.exists()


def test_output_that_is_not_utf8_keeps_what_can_be_read(saga: Saga) -> None:
    entry = {
        **command("bytes", "SessionStart"),
        "argv": [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'ok \\xff')"],
    }
    load_hooks(entries=[entry])

    assert run(saga, Event.SESSION_START).context == "ok \ufffd"
