"""Lifecycle hooks and references wired into the orchestration: a real Celery worker runs the steps
(and so the hooks), the fake OpenAI-compatible server answers for every role."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import User
from agents.actions import load_profiles
from agents.hooks import prepare_prompt
from agents.hooks.actions import load_hooks
from agents.orchestrator.actions import load_brains
from agents.orchestrator.models import Prompt
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Collaborator, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.agents.hooks_support import alive, command, python
from tests.agents.orchestration_support import request_text, settled, submit
from tests.support import CeleryWorker, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("fake_brain")]


def hook_events(saga: Saga, type: str) -> list[dict[str, object]]:
    return list(JournalEvent.objects.filter(saga=saga, type=type).order_by("seq").values_list("data", flat=True))


def test_a_session_start_block_ends_the_prompt_blocked_before_routing(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    verdict = json.dumps({"decision": "block", "reason": "No work on release day."})
    load_hooks(entries=[command("freeze", "SessionStart", "--print", verdict)])
    client = client_for(alice)

    started = submit(client, saga, prompt="Implement the cursor, with tests.", brain="fake")
    body = settled(client, started["prompt_id"])

    assert body["status"] == "blocked" and body["reason"] == "No work on release day.", body
    assert body["plan"] is None and body["results"] == [] and body["final_answer"] == ""
    assert fake_llm.calls_for("router-m") == [] and fake_llm.calls_for("coder-m") == []
    lead = Collaborator.objects.get(saga=saga, name=started["lead"].removeprefix("agent:"))
    assert not Collaborator.objects.filter(saga=saga, name__startswith=f"{lead.name}.").exists()
    (event,) = hook_events(saga, "hook_session_start")
    assert event["decision"] == "block" and event["handler"] == "freeze"
    assert hook_events(saga, "hook_user_prompt_submit") == []  # nothing after the block ran
    assert [e["reason"] for e in hook_events(saga, "prompt.blocked")] == ["No work on release day."]


def test_hooks_wrap_every_step_and_artifacts_reach_the_workers(
    worker: CeleryWorker,
    fake_llm: FakeLLM,
    saga: Saga,
    alice: User,
    client_for: Callable[[User], APIClient],
    tmp_path: Path,
) -> None:
    actions.add_artifact(saga=saga, name="spec.md", content=b"Cursor tokens are opaque.", content_type="text/plain",
                         by=alice)  # fmt: skip
    seen_stop = tmp_path / "subagent-stop.json"
    load_hooks(
        entries=[
            command("house", "UserPromptSubmit", "--print", json.dumps({"additional_context": "House rule: no v1."})),
            python("tester-help", "SubagentStart", "add_context", matcher="tester"),
            command("no-writer", "SubagentStart", "--print",
                    json.dumps({"decision": "block", "reason": "Writers are on leave."}), matcher="writer"),
            command("observer", "SubagentStop", "--stdin-to", str(seen_stop)),
            command("notes", "Stop", "--print", json.dumps({"additional_context": "Cite the changelog."})),
        ]
    )  # fmt: skip
    fake_llm.script("router-m", say("Sure! The coder should take this one."))  # garbage: the heuristic plans
    tester_result = {"summary": "Twelve cases pass.", "artifacts": ["spec.md", {"kind": "artifact", "uri": "ghost.md"}]}
    fake_llm.script("tester-m", say("", tool_call("finish", {"result": tester_result})))
    fake_llm.script("coder-m", say("", tool_call("finish", {"result": "Use an opaque cursor."})))
    fake_llm.script("review-m", say(json.dumps({"decision": "approve", "confidence": 0.9})))
    client = client_for(alice)

    started = submit(client, saga, prompt="Implement @artifact:spec.md, with tests and a changelog.", brain="fake")
    body = settled(client, started["prompt_id"])

    assert [w["role"] for w in body["plan"]["workers"]] == ["tester", "writer"], body
    # Expanded, with the hook's context: what the router and every worker got.
    assert "Cursor tokens are opaque." in body["expanded"] and "House rule: no v1." in body["expanded"]
    (router_call,) = fake_llm.calls_for("router-m")
    assert "Cursor tokens are opaque." in request_text(router_call) and "House rule" in request_text(router_call)
    (tester_call,) = fake_llm.calls_for("tester-m")
    tester_text = request_text(tester_call)
    assert "Cursor tokens are opaque." in tester_text and "House rule: no v1." in tester_text
    assert "python saw SubagentStart for tester" in tester_text  # its own SubagentStart context
    assert "Cursor tokens are opaque." in request_text(fake_llm.calls_for("coder-m")[0])
    # The blocked worker never called its model and failed with the reason; the other one completed.
    assert fake_llm.calls_for("writer-m") == []
    tester, writer = body["results"]
    assert (tester["status"], tester["summary"]) == ("completed", "Twelve cases pass.")
    # The artifact it names is a reference to its download; the one the saga lacks is a risk.
    (spec,) = tester["artifacts"]
    assert (spec["kind"], spec["label"]) == ("artifact", "spec.md")
    assert spec["uri"] == f"/api/v1/sagas/{saga.pk}/artifacts/spec.md"
    assert client.get(spec["uri"]).content == b"Cursor tokens are opaque."
    assert tester["risks"] == ["Artifact ghost.md is not in this saga: the result names it, nothing was attached."]
    assert writer["status"] == "failed" and writer["risks"] == ["Writers are on leave."]
    writer_run = Collaborator.objects.get(saga=saga, name__endswith=".writer").run
    assert (writer_run.status, writer_run.error) == ("failed", "Writers are on leave.")
    assert [w.get("blocked", "") for w in body["plan"]["workers"]] == ["", "Writers are on leave."]
    # SubagentStop saw the successful result only; Stop's context is feedback on the final answer.
    stop_event = json.loads(seen_stop.read_text())
    assert stop_event["role"] == "tester" and stop_event["result"]["summary"] == "Twelve cases pass."
    assert body["final_answer"].startswith("Use an opaque cursor.")
    assert body["final_answer"].endswith("--- Feedback from hooks ---\nCite the changelog.")
    assert [e["handler"] for e in hook_events(saga, "hook_user_prompt_submit")] == ["house"]
    starts = {e["role"]: e["decision"] for e in hook_events(saga, "hook_subagent_start")}
    assert starts == {"tester": "", "writer": "block"}
    assert [e["role"] for e in hook_events(saga, "hook_subagent_stop")] == ["tester"]
    assert [e["handler"] for e in hook_events(saga, "hook_stop")] == ["notes"]
    # The plan view shows the same: the artifact's link, the block's reason, each hook, the feedback.
    page = Client()
    page.force_login(alice)
    html = page.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert f'<a href="/sagas/{saga.pk}/artifacts/spec.md">spec.md</a>' in html
    assert 'data-role="writer" data-status="blocked"' in html and "blocked by a hook: Writers are on leave." in html
    assert 'data-hook="no-writer" data-event="SubagentStart" data-status="blocked"' in html
    assert 'data-hook="notes" data-event="Stop" data-status="ok"' in html
    assert "feedback from hooks: Cite the changelog." in html


def hook_span(event: JournalEvent) -> tuple[float, float]:
    """When a handler ran, from what was recorded: it is stored (and journaled) as it finishes,
    after `duration_ms`."""
    end = event.created_at.timestamp()
    return end - event.data["duration_ms"] / 1000, end


def test_the_support_workers_subagent_start_hooks_run_side_by_side(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    """Two support workers, each with a 2 s SubagentStart handler, two worker processes: each
    worker runs its own hook in its own task, so the two runs overlap; a block on one fails only
    that one."""
    load_hooks(
        entries=[
            command("slow", "SubagentStart", "--sleep", "2", "--print", "Slow context."),
            python("no-writer", "SubagentStart", "block", matcher="writer"),
        ]
    )
    fake_llm.script("tester-m", say("", tool_call("finish", {"result": {"summary": "Tested."}})))
    client = client_for(alice)

    started = submit(client, saga, prompt="Implement the cursor.", brain="fake", team=["tester", "writer"])
    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed", body
    slow = {e.data["role"]: e for e in JournalEvent.objects.filter(saga=saga, type="hook_subagent_start")
            if e.data["handler"] == "slow"}  # fmt: skip
    assert sorted(slow) == ["tester", "writer"] and all(e.data["status"] == "ok" for e in slow.values())
    (tester_start, tester_end), (writer_start, writer_end) = hook_span(slow["tester"]), hook_span(slow["writer"])
    assert tester_start < writer_end and writer_start < tester_end, (tester_start, tester_end, writer_start,
                                                                      writer_end)  # fmt: skip
    # The block failed the writer alone, before any model call; the tester got the context.
    tester, writer = body["results"]
    assert (tester["status"], tester["summary"]) == ("completed", "Tested.")
    assert writer["status"] == "failed" and writer["risks"] == ["python policy refuses: Implement the cursor."]
    assert fake_llm.calls_for("writer-m") == []
    assert "--- Context from hooks ---\\nSlow context." in request_text(fake_llm.calls_for("tester-m")[0])  # in JSON
    # Each ran once: a hook run is stored under its key.
    assert sorted((e["role"], e["handler"]) for e in hook_events(saga, "hook_subagent_start")) == [
        ("tester", "slow"), ("writer", "no-writer"), ("writer", "slow")
    ]  # fmt: skip


def test_a_worker_killed_mid_subagent_start_runs_no_finished_handler_again(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, client_for: Callable[[User], APIClient],
    redis_url: str, artifacts: Path,
    runtime_env: dict[str, str], tmp_path: Path,
) -> None:  # fmt: skip
    from sagas.tasks import reconcile

    count, marker, pid = tmp_path / "count", tmp_path / "hung", tmp_path / "pid"
    load_hooks(
        entries=[
            command("quick", "SubagentStart", "--count", str(count), "--print", "Quick context."),
            # Hangs on its first run only, so that the worker can be killed while it waits.
            command("stuck", "SubagentStart", "--pid", str(pid), "--hang-unless", str(marker), "--print", "Late.",
                    timeout_s=120),
        ]
    )  # fmt: skip
    fake_llm.script("tester-m", say("", tool_call("finish", {"result": {"summary": "Tested."}})))
    client = client_for(alice)
    started = submit(client, saga, prompt="Implement the cursor.", brain="fake", team=["tester"])
    wait_until(lambda: count.exists() and marker.exists(), timeout=60, what="quick to run and stuck to hang")
    wait_until(lambda: hook_events(saga, "hook_subagent_start"), timeout=30, what="quick stored")

    worker.kill()
    wait_until(lambda: not alive(int(pid.read_text())), timeout=10, what="the orphaned command to exit")
    replacement = CeleryWorker(redis_url, artifacts, env=runtime_env)
    try:

        def done() -> bool:
            reconcile()  # as the beat would: reclaims the tester's lapsed lease
            return Prompt.objects.get(pk=started["prompt_id"]).status != "running"

        wait_until(done, timeout=60, interval=0.5, what="the worker to resume and finish")
    finally:
        replacement.kill()

    body = client.get(f"/api/v1/prompts/{started['prompt_id']}/").json()
    assert body["status"] == "completed" and body["results"][0]["summary"] == "Tested.", body
    assert count.read_text() == "ran\n"  # quick ran once, before the crash
    assert sorted(str(e["handler"]) for e in hook_events(saga, "hook_subagent_start")) == ["quick", "stuck"]
    (call,) = fake_llm.calls_for("tester-m")
    assert "Quick context.\\n\\nLate." in request_text(call)  # both contexts, in the handoff's JSON


def test_bad_references_are_refused_at_submission(
    saga: Saga, alice: User, client_for: Callable[[User], APIClient], bob: User
) -> None:
    hidden = actions.create_saga(title="Bob's", goal="Not for Alice", owner=bob)
    client = client_for(alice)
    url = f"/api/v1/sagas/{saga.pk}/prompts/"

    unknown = client.post(url, {"prompt": "Use @artifact:ghost.md", "brain": "fake"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["code"] == "invalid_payload"
    assert "ghost.md" in unknown.json()["detail"]
    hidden_ref = client.post(url, {"prompt": f"Do as in @@{hidden.pk}", "brain": "fake"}, format="json")
    missing_ref = client.post(url, {"prompt": "Do as in @@00000000-0000-0000-0000-000000000000"}, format="json")
    assert hidden_ref.status_code == missing_ref.status_code == 404
    assert hidden_ref.json()["code"] == "not_found" and hidden_ref.json()["title"] == missing_ref.json()["title"]
    assert Prompt.objects.count() == 0 and not JournalEvent.objects.filter(saga=saga, type="prompt.submitted")


def test_routing_run_again_after_a_crash_does_not_run_a_finished_hook_twice(
    saga: Saga, alice: User, tmp_path: Path, settings: LazySettings
) -> None:
    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the steps run here, in this process
    load_profiles(entries=[{"name": f"k-{r}", "role": r, "model": "m-none", "tools": ["finish"]} for r in ("r", "c")])
    load_brains(entries=[{"name": "k", "planner_profile": "k-r", "roles": {"coder": "k-c"}, "default_primary": "coder",
                          "review_role": ""}])  # fmt: skip
    ran = tmp_path / "ran"
    load_hooks(entries=[command("count", "SessionStart", "--count", str(ran))])
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="k")
    # A first routing ran the hooks, then its worker died before the step moved on.
    prepare_prompt(saga=saga, user=alice, prompt_id=prompt.pk, text=prompt.text, brain="k")
    assert ran.read_text().count("ran") == 1

    steps.advance(str(prompt.pk))  # the resumed routing

    prompt.refresh_from_db()
    assert prompt.step == "primary" and prompt.status == "running"
    assert ran.read_text().count("ran") == 1  # stored under its key: not run again
    assert len(hook_events(saga, "hook_session_start")) == 1


@pytest.mark.parametrize("event", ["SubagentStop", "Stop"])
def test_a_doorbell_while_a_steps_hooks_run_leaves_the_step_to_them(
    event: str, worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User,
    client_for: Callable[[User], APIClient], tmp_path: Path, settings: LazySettings,
) -> None:  # fmt: skip
    """A handler's result is stored once it has finished: a second doorbell while a step's hooks
    still run (the periodic resume once the step is `AGORA_RERING_S` old, two workers ending
    together) finds the step's lease held and runs nothing; the task that holds it ends the prompt."""
    from agents.orchestrator import steps

    settings.AGORA_HOOKS_INLINE = True  # the second doorbell is rung here, in this process
    ran, gate = tmp_path / "ran", tmp_path / "gate"
    noted = json.dumps({"additional_context": "Noted."})
    load_hooks(entries=[command("slow", event, "--count", str(ran), "--wait-for", str(gate), "--print", noted)])
    plan = {"primary_role": "coder", "workers": [], "requires_review": False, "reason": "Small."}
    fake_llm.script("router-m", say(json.dumps(plan)))
    fake_llm.script("coder-m", say("", tool_call("finish", {"result": "Use an opaque cursor."})))
    fake_llm.script("tester-m", say("", tool_call("finish", {"result": {"summary": "Tested."}})))
    client = client_for(alice)
    # SubagentStop: the support workers' step (forced roles); Stop: the primary's step.
    team = ["tester"] if event == "SubagentStop" else []
    started = submit(client, saga, prompt="Implement the cursor.", brain="fake", team=team)
    wait_until(ran.exists, timeout=60, what=f"the {event} hook to start")

    steps.advance(started["prompt_id"])  # the second doorbell, while the hook waits at its gate

    assert ran.read_text() == "ran\n"  # it did not run the hook again
    assert Prompt.objects.get(pk=started["prompt_id"]).step_until is not None  # the first one's lease
    gate.touch()
    body = settled(client, started["prompt_id"])
    assert body["status"] == "completed", body
    assert ran.read_text() == "ran\n"
    journaled = "hook_subagent_stop" if event == "SubagentStop" else "hook_stop"
    assert [e["handler"] for e in hook_events(saga, journaled)] == ["slow"]
    if event == "Stop":
        assert body["final_answer"].endswith("Noted."), body


def test_routing_holds_its_lease_for_the_hooks_before_it_too(saga: Saga, alice: User, settings: LazySettings) -> None:
    """A SessionStart handler may take longer than the router's lease alone: the lease covers the
    hooks' deadlines as well, so that the periodic resume does not run them again meanwhile."""
    from django.utils import timezone

    from agents.hooks.runner import REPORT_GRACE_S
    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.hooking import claim_routing

    settings.AGORA_ROUTING_LEASE_S = 60
    load_hooks(entries=[command("slow", "SessionStart", "--sleep", "1", timeout_s=400),
                        python("quick", "UserPromptSubmit", "add_context", timeout_s=30)])  # fmt: skip
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake")
    before = timezone.now()

    assert claim_routing(prompt) is True

    prompt.refresh_from_db()
    assert prompt.step_until is not None
    # The router's lease, the command's timeout with the grace for its report, the python handler's.
    lease = (prompt.step_until - before).total_seconds()
    hooks = 400 + REPORT_GRACE_S + 30  # the command's timeout with the grace for its report, the python handler's
    assert 60 + hooks <= lease < 60 + hooks + 5, lease


def test_a_step_that_fails_on_the_database_gives_its_lease_back_and_its_retry_runs_no_hook_again(
    saga: Saga, alice: User, tmp_path: Path, settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its hooks ran and stored their results, then its transaction met a database error: the
    retry takes the step at once (it waited for the lease to lapse: the hooks' whole timeouts)."""
    from django.db import OperationalError

    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the steps run here, in this process
    load_profiles(entries=[{"name": f"k-{r}", "role": r, "model": "m-none", "tools": ["finish"]} for r in ("r", "c")])
    load_brains(entries=[{"name": "k", "planner_profile": "k-r", "roles": {"coder": "k-c"}, "default_primary": "coder",
                          "review_role": ""}])  # fmt: skip
    ran = tmp_path / "ran"
    load_hooks(entries=[command("count", "SessionStart", "--count", str(ran), timeout_s=300)])
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="k")
    moving = steps.move

    def lost_connection(*args: object, **kwargs: object) -> bool:
        raise OperationalError("the server closed the connection")  # injected once, where the step moves

    monkeypatch.setattr(steps, "move", lost_connection)
    with pytest.raises(OperationalError):
        steps.advance(str(prompt.pk))
    assert Prompt.objects.get(pk=prompt.pk).step_until is None  # given back, not left for 300 s and more

    monkeypatch.setattr(steps, "move", moving)
    steps.advance(str(prompt.pk))  # the retry

    assert Prompt.objects.get(pk=prompt.pk).step == "primary"
    assert ran.read_text().count("ran") == 1  # stored under its key: not run again
