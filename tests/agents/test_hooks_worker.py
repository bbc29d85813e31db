"""Hooks in real Celery worker processes: every type through the task, and a worker killed in the
middle of a hook run whose finished handler does not run again."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import transaction

from accounts.models import User
from agents.hooks import Event, stored_outcome
from agents.hooks.actions import load_hooks
from agents.hooks.models import HookResult
from config.celery import app
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Saga
from tests.agents.hooks_support import Hookbin, alive, command, hookbin, python, webhook
from tests.support import CeleryWorker, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def saga(transactional_db: None, alice: User) -> Saga:
    return actions.create_saga(title="Hooked", goal="Hooks in workers", owner=alice)


@pytest.fixture
def bin_() -> Iterator[Hookbin]:
    with hookbin() as server:
        yield server


def ring(saga: Saga, event: Event, key: str, *, role: str = "", payload: dict[str, str] | None = None) -> None:
    with transaction.atomic():  # as a caller would: the bell rings once its transaction commits
        transaction.on_commit(
            lambda: app.send_task(
                "agents.hooks.run_hooks", args=[str(saga.pk), event.value, payload or {}, key], kwargs={"role": role}
            )
        )


def stored(saga: Saga, key: str, count: int) -> list[HookResult] | None:
    results = list(HookResult.objects.filter(saga=saga, key=key))
    return results if len(results) >= count else None


def test_every_type_runs_in_a_worker_and_blocks_or_adds_context(
    celery_worker: CeleryWorker, saga: Saga, bin_: Hookbin, tmp_path: Path
) -> None:
    bin_.reply = (200, json.dumps({"additional_context": "From the webhook."}))
    load_hooks(
        entries=[
            command("cmd", "UserPromptSubmit", "--print", "From the command."),
            webhook("hook", "UserPromptSubmit", bin_.url),
            python("policy", "UserPromptSubmit", "block"),
        ]
    )

    ring(saga, Event.USER_PROMPT_SUBMIT, "p1:UserPromptSubmit", payload={"prompt": "Delete prod"})
    wait_until(lambda: stored(saga, "p1:UserPromptSubmit", 3), timeout=60, what="three hook results")

    outcome = stored_outcome(saga_id=saga.pk, event="UserPromptSubmit", key="p1:UserPromptSubmit")
    assert outcome.blocked and outcome.reason == "python policy refuses: Delete prod"
    assert outcome.context == "From the command.\n\nFrom the webhook."
    assert bin_.received[0]["prompt"] == "Delete prod"
    types = JournalEvent.objects.filter(saga=saga, type="hook_user_prompt_submit").values_list("data", flat=True)
    assert sorted(d["handler"] for d in types) == ["cmd", "hook", "policy"]


def test_each_event_in_a_worker(celery_worker: CeleryWorker, saga: Saga, bin_: Hookbin) -> None:
    bin_.reply = (200, json.dumps({"decision": "block", "reason": "SubagentStop cannot block"}))
    feedback = json.dumps({"additional_context": "Cite the changelog."})
    load_hooks(
        entries=[
            command("start", "SessionStart", "--print", "Repo: agora."),
            python("gate", "SubagentStart", "block", matcher="coder"),
            webhook("stop-audit", "SubagentStop", bin_.url),
            command("feedback", "Stop", "--print", feedback),
        ]
    )

    for event, role in [(Event.SESSION_START, ""), (Event.SUBAGENT_START, "coder"), (Event.SUBAGENT_STOP, "coder"),
                        (Event.STOP, "")]:  # fmt: skip
        ring(saga, event, f"p1:{event.value}", role=role, payload={"prompt": "Go"})
    keys = [f"p1:{e.value}" for e in (Event.SESSION_START, Event.SUBAGENT_START, Event.SUBAGENT_STOP, Event.STOP)]
    wait_until(lambda: all(stored(saga, key, 1) for key in keys), timeout=60, what="every event's outcome")

    def outcome(event: Event) -> tuple[bool, str, str]:
        result = stored_outcome(saga_id=saga.pk, event=event, key=f"p1:{event.value}")
        return result.blocked, result.reason, result.context

    assert outcome(Event.SESSION_START) == (False, "", "Repo: agora.")
    assert outcome(Event.SUBAGENT_START) == (True, "python policy refuses: Go", "")
    assert outcome(Event.SUBAGENT_STOP) == (False, "", "")
    assert outcome(Event.STOP) == (False, "", "Cite the changelog.")
    journaled = set(JournalEvent.objects.filter(saga=saga, type__startswith="hook_").values_list("type", flat=True))
    assert journaled == {"hook_session_start", "hook_subagent_start", "hook_subagent_stop", "hook_stop"}


def test_a_worker_killed_mid_hook_does_not_run_a_finished_handler_again(
    redis_url: str, artifacts: Path, saga: Saga, tmp_path: Path
) -> None:
    count, marker, pid = tmp_path / "count", tmp_path / "hung", tmp_path / "pid"
    load_hooks(
        entries=[
            command("quick", "SessionStart", "--count", str(count), "--print", "Quick context."),
            # Hangs on its first run only, so that the worker can be killed while it waits.
            command("stuck", "SessionStart", "--pid", str(pid), "--hang-unless", str(marker), "--print", "Late.",
                    timeout_s=120),
        ]
    )  # fmt: skip
    first = CeleryWorker(redis_url, artifacts)
    try:
        ring(saga, Event.SESSION_START, "p1:SessionStart")
        wait_until(lambda: stored(saga, "p1:SessionStart", 1) and marker.exists(), timeout=60, what="quick stored")
        first.kill()
    finally:
        first.stop()
    # Its hanging command notices its parent's death and exits (an orphan would outlive the test).
    wait_until(lambda: not alive(int(pid.read_text())), timeout=10, what="the orphaned command to exit")

    second = CeleryWorker(redis_url, artifacts)
    try:
        ring(saga, Event.SESSION_START, "p1:SessionStart")  # the retry (a redelivery or the caller's own)
        wait_until(lambda: stored(saga, "p1:SessionStart", 2), timeout=60, what="stuck stored")
    finally:
        second.kill()

    assert count.read_text() == "ran\n"  # quick ran once, before the crash
    outcome = stored_outcome(saga_id=saga.pk, event="SessionStart", key="p1:SessionStart")
    assert outcome.context == "Quick context.\n\nLate."
    handlers = JournalEvent.objects.filter(saga=saga, type="hook_session_start").values_list("data", flat=True)
    assert sorted(d["handler"] for d in handlers) == ["quick", "stuck"]  # each journaled once
