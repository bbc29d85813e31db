"""The orchestrator end to end: prompts submitted through the REST API, a real Celery worker, the
scripted provider and the local fake OpenAI-compatible server. A prompt runs its support workers, a
primary and a review; the router's garbage and a failing worker still end it; forced roles answer
side by side; a worker that went idle awaiting a person's answer waits for it; a worker killed
with SIGKILL mid-orchestration is replaced without duplicates; and after a restart of the whole stack
(the worker killed, Redis restarted empty) the new worker's start carries the orchestration on."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.layers import channel_layers
from django.conf import LazySettings
from redis import Redis
from rest_framework.test import APIClient

from accounts.models import User
from agents.actions import load_profiles
from agents.orchestrator.models import Prompt
from config.celery import app as celery_app
from config.settings import caches_for, channel_layers_for
from journal.models import JournalEvent
from sagas.models import Collaborator, Delegation, Saga
from tests.agents.fake_llm import GATE, SERVER_ERROR, FakeLLM, say, tool_call
from tests.agents.orchestration_support import request_text, settled, submit, types
from tests.conftest import use_broker
from tests.support import CeleryWorker, RedisServer, wait_until


def test_a_prompt_runs_workers_a_primary_and_a_review_on_scripted_playbooks(
    worker: CeleryWorker, default_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    client = client_for(alice)
    started = submit(client, saga, prompt="Migrate GET /v2/orders to cursor pagination, with tests and docs.")
    assert started["status"] == "running" and started["lead"].startswith("agent:brain-")

    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed", body
    plan = body["plan"]
    assert plan["source"] == "router" and plan["primary_role"] == "coder" and plan["requires_review"] is True
    assert [w["role"] for w in plan["workers"]] == ["researcher", "tester", "writer"]
    assert [(r["role"], r["status"]) for r in body["results"]] == [
        ("researcher", "completed"), ("tester", "completed"), ("writer", "completed")
    ]  # fmt: skip
    tester = body["results"][1]
    assert (
        tester["task_id"] == f"task:{body['prompt_id']}:tester" and tester["parent_id"] == f"prompt:{body['prompt_id']}"
    )
    assert tester["next_questions"] and "Twelve cases" in tester["summary"]
    assert "opaque cursor" in body["answer"]
    assert body["review"]["decision"] == "approve" and body["review"]["source"] == "reviewer"
    assert body["final_answer"].startswith(body["answer"]) and "Review: approve" in body["final_answer"]
    # Every worker is a delegation of the lead, and each ran once.
    lead = Collaborator.objects.get(saga=saga, name=started["lead"].removeprefix("agent:"))
    delegates = Delegation.objects.filter(delegator=lead).values_list("delegate__name", flat=True)
    assert sorted(n.split(".", 1)[1] for n in delegates) == ["primary", "researcher", "review", "tester", "writer"]
    seen = types(saga)
    assert seen.count("worker_start") == 5 and seen.count("worker_end") == 5
    order = [t for t in seen if t in ("prompt.submitted", "plan.created", "primary.completed", "review.completed",
                                      "prompt.completed")]  # fmt: skip
    assert order == ["prompt.submitted", "plan.created", "primary.completed", "review.completed", "prompt.completed"]
    assert lead.run.status == "completed"


def test_garbage_from_the_router_a_failing_worker_and_a_missing_review(
    worker: CeleryWorker, fake_llm: FakeLLM, fake_brain: None, saga: Saga, alice: User,
    client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    fake_llm.script("router-m", say("Sure! The coder should take this one."))
    fake_llm.script("tester-m", say("All twelve cases pass."))  # text, no finish: the text is the summary
    fake_llm.script("writer-m", SERVER_ERROR)  # its whole chain fails
    fake_llm.script("coder-m", say("", tool_call("finish", {"result": "Use an opaque cursor."})))
    fake_llm.script("review-m", say("Looks good to me."))  # not the review JSON
    client = client_for(alice)

    started = submit(client, saga, prompt="Implement the cursor, with tests and a changelog.", brain="fake")
    body = settled(client, started["prompt_id"])

    plan = body["plan"]
    assert plan["source"] == "heuristic" and "not a JSON object" in plan["router_error"]
    assert plan["primary_role"] == "coder" and [w["role"] for w in plan["workers"]] == ["tester", "writer"]
    tester, writer = body["results"]
    assert (tester["status"], tester["summary"]) == ("completed", "All twelve cases pass.")
    assert writer["status"] == "failed" and writer["risks"] == ["Every model candidate failed."]
    assert body["answer"] == "Use an opaque cursor."
    # The primary saw both results through the shared formatter; a worker saw only its own handoff.
    (primary_call,) = fake_llm.calls_for("coder-m")
    assert "### tester (completed)" in request_text(primary_call)
    assert "### writer (failed)" in request_text(primary_call)
    (tester_call,) = fake_llm.calls_for("tester-m")
    assert f"task:{body['prompt_id']}:tester" in request_text(tester_call)
    assert f"task:{body['prompt_id']}:writer" not in request_text(tester_call)
    # The reviewer got the request, the primary's answer, every worker's result and its own handoff.
    (review_call,) = fake_llm.calls_for("review-m")
    sent, prompt_id = delegated_task(review_call), body["prompt_id"]
    assert "Original request:\nImplement the cursor, with tests and a changelog.\n" in sent
    assert "Primary answer:\nUse an opaque cursor.\n" in sent
    for role, status, line in (("tester", "completed", "Summary: All twelve cases pass."),
                               ("writer", "failed", "Risks:\n- Every model candidate failed.")):  # fmt: skip
        assert f"### {role} ({status})\nTask: task:{prompt_id}:{role} -> prompt:{prompt_id}\n" in sent
        assert line in sent.split(f"### {role} ({status})", 1)[1].split("###", 1)[0]
    packet = json.loads(sent.split("Your handoff:\n", 1)[1].split("\n", 1)[0])
    assert packet["id"] == f"handoff:{prompt_id}:review"
    assert packet["task"] == {
        "id": f"task:{prompt_id}:review", "parent_id": f"prompt:{prompt_id}",
        "goal": "Review the primary answer against the request.",
        "original_prompt": "Implement the cursor, with tests and a changelog.",
    }  # fmt: skip
    # The malformed review becomes what the brain's policy says.
    assert body["status"] == "blocked" and body["review"]["decision"] == "blocked"
    assert body["review"]["source"] == "policy" and body["reason"]
    seen = types(saga)
    assert "model_fallback" in seen and "prompt.blocked" in seen


def delegated_task(call: dict[str, Any]) -> str:
    """The task a worker's model was handed: its first input is the engine's header line, then the
    handoff as JSON."""
    first = next(m["content"] for m in call["messages"] if m["role"] == "user")
    return str(json.loads(first.split("\n", 1)[1])["task"])


def test_forced_roles_answer_side_by_side_without_router_or_review(
    worker: CeleryWorker, fake_llm: FakeLLM, fake_brain: None, saga: Saga, alice: User,
    client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    fake_llm.script("tester-m", say("Test the empty page."))
    fake_llm.script("writer-m", say("Say it in the changelog."))
    client = client_for(alice)

    started = submit(client, saga, prompt="What matters most here?", brain="fake", team=["tester", "writer"])
    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed" and body["plan"]["source"] == "team"
    assert body["plan"]["requires_review"] is False and body["review"] is None
    assert (
        body["answer"]
        == "## tester (completed)\nTest the empty page.\n\n## writer (completed)\nSay it in the changelog."
    )
    assert fake_llm.calls_for("router-m") == [] and fake_llm.calls_for("review-m") == []
    assert fake_llm.calls_for("coder-m") == []  # no primary either: the team's answers are the answer


def test_a_worker_that_went_idle_awaiting_a_persons_answer_is_not_done_until_it_comes(
    worker: CeleryWorker, fake_llm: FakeLLM, fake_brain: None, saga: Saga, alice: User,
    client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    from agents.orchestrator import steps
    from sagas.actions import answer_human_request
    from sagas.models import HumanRequest, Run

    asking = {"name": "f-tester", "role": "Tester", "model": "tester-m", "tools": ["ask_human", "finish"]}
    load_profiles(entries=[asking])
    plan = {"primary_role": "coder", "workers": [{"role": "tester"}], "requires_review": False}
    fake_llm.script("router-m", say(json.dumps(plan)))
    form = {"title": "Which Python?", "fields": [{"name": "version", "label": "Version", "type": "text"}]}
    fake_llm.script(
        "tester-m",
        say("", tool_call("ask_human", form)),
        say("I asked which Python to target."),  # answers in text and goes idle, its question open
        say("", tool_call("finish", {"result": {"summary": "Targets Python 3.12."}})),
    )  # fmt: skip
    fake_llm.script("coder-m", say("", tool_call("finish", {"result": "Done for 3.12."})))
    client = client_for(alice)
    started = submit(client, saga, prompt="Implement the cursor.", brain="fake")
    prompt = Prompt.objects.get(pk=started["prompt_id"])
    tester = Run.objects.filter(collaborator__saga=saga, collaborator__name=prompt.worker_name("tester"))
    rested = JournalEvent.objects.filter(saga=saga, type="run.idle", run_id__in=tester)
    wait_until(rested.exists, what="the tester to go idle")

    # It answered in text, but its question is open: the step its rest rang found it not done, and
    # trying the step again changes nothing.
    assert steps.advance(str(prompt.pk), worker="test") == []
    assert tester.get().status == "idle"
    prompt.refresh_from_db()
    assert (prompt.status, prompt.step) == ("running", "workers") and fake_llm.calls_for("coder-m") == []
    assert not Collaborator.objects.filter(saga=saga, name=prompt.worker_name("primary")).exists()

    form_id = HumanRequest.objects.get(asker__run__in=tester).pk
    answer_human_request(human_request_id=form_id, answer={"version": "3.12"}, by=alice)
    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed", body
    assert [(r["role"], r["summary"]) for r in body["results"]] == [("tester", "Targets Python 3.12.")]
    (primary_call,) = fake_llm.calls_for("coder-m")
    assert "Targets Python 3.12." in request_text(primary_call) and body["answer"] == "Done for 3.12."
    assert len(fake_llm.calls_for("tester-m")) == 3


def test_kill_9_mid_orchestration_resumes_without_duplicates(
    worker: CeleryWorker, fake_llm: FakeLLM, fake_brain: None, saga: Saga, alice: User, redis_url: str,
    artifacts: Path, runtime_env: dict[str, str], client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    from agents.orchestrator.tasks import resume_prompts
    from sagas.tasks import reconcile

    fake_llm.script("router-m", say('{"primary_role": "coder", "workers": [{"role": "tester"}, {"role": "writer"}]}'))
    fake_llm.script("writer-m", say("Changelog drafted."))
    fake_llm.script("tester-m", GATE, say("All pass."))  # the first call hangs: the crash comes meanwhile
    fake_llm.script("coder-m", say("Ship it."))
    fake_llm.script("review-m", say('{"decision": "approve", "confidence": 0.9}'))
    client = client_for(alice)
    started = submit(client, saga, prompt="Implement the cursor.", brain="fake")
    prompt = Prompt.objects.get(pk=started["prompt_id"])
    wait_until(lambda: fake_llm.calls_for("tester-m") and fake_llm.calls_for("writer-m"), what="both workers called")
    wait_until(
        lambda: Collaborator.objects.get(saga=saga, name=prompt.worker_name("writer")).run.status != "running",
        what="the writer to answer",
    )

    worker.kill()
    replacement = CeleryWorker(redis_url, artifacts, env=runtime_env)
    try:

        def done() -> bool:
            reconcile()  # as the beat would: reclaims the tester's lapsed lease
            resume_prompts()
            return Prompt.objects.get(pk=prompt.pk).status != "running"

        wait_until(done, timeout=60, interval=0.5, what="the orchestration to resume and finish")
    finally:
        fake_llm.gate.set()
        replacement.kill()

    body = client.get(f"/api/v1/prompts/{prompt.pk}/").json()
    assert body["status"] == "completed", body
    assert [(r["role"], r["summary"]) for r in body["results"]] == [
        ("tester", "All pass."),
        ("writer", "Changelog drafted."),
    ]
    assert types(saga).count("plan.created") == 1
    lead = Collaborator.objects.get(saga=saga, name=prompt.lead_name)
    assert Delegation.objects.filter(delegator=lead).count() == 4  # tester, writer, primary, review: once each
    assert len(fake_llm.calls_for("router-m")) == 1 and len(fake_llm.calls_for("writer-m")) == 1
    assert len(fake_llm.calls_for("coder-m")) == 1 and len(fake_llm.calls_for("tester-m")) == 2


@pytest.fixture
def own_redis(redis_url: str, tmp_path: Path, settings: LazySettings) -> Iterator[tuple[RedisServer, str]]:
    """A Redis server of this test's own, which it restarts: the session's is shared with other tests."""
    server = RedisServer(tmp_path / "redis")
    url = f"{server.base_url}/0"
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = channel_layers_for(url)
    settings.CACHES = caches_for(url)
    channel_layers.backends.clear()
    use_broker(url)
    try:
        yield server, url
    finally:
        channel_layers.backends.clear()
        server.stop()


@pytest.mark.parametrize("runtime_env", [{"OPENAI_TIMEOUT_S": "30"}], indirect=True)  # the held call outlasts 2 s
def test_a_whole_stack_restart_mid_orchestration_resumes_it_at_the_new_workers_start(
    own_redis: tuple[RedisServer, str], fake_llm: FakeLLM, fake_brain: None, saga: Saga, alice: User,
    artifacts: Path, runtime_env: dict[str, str], client_for: Callable[[User], APIClient],
) -> None:  # fmt: skip
    """The worker is killed with SIGKILL while the writer has answered and the tester's model call is
    under way; a prompt submitted meanwhile leaves its doorbell in Redis; Redis restarts empty (every
    message lost) and a new worker starts. Nothing else rings: what the new worker does as it starts
    (config/celery.py, `reconcile_at_start`) must carry both prompts to the end."""
    from django.utils import timezone

    from sagas.actions import create_saga
    from sagas.models import Run

    redis, url = own_redis
    fake_llm.script("router-m", say('{"primary_role": "coder", "workers": [{"role": "tester"}, {"role": "writer"}]}'))
    fake_llm.script("writer-m", say("", tool_call("finish", {"result": "Changelog drafted."})))
    fake_llm.script("tester-m", GATE, say("All pass."))  # the first call is held: the crash comes meanwhile
    fake_llm.script("coder-m", say("Ship it."))
    fake_llm.script("review-m", say('{"decision": "approve", "confidence": 0.9}'))
    client = client_for(alice)
    first = CeleryWorker(url, artifacts, env=runtime_env)
    replacement: CeleryWorker | None = None
    try:
        prompt = Prompt.objects.get(pk=submit(client, saga, prompt="Implement the cursor.", brain="fake")["prompt_id"])
        tester = Run.objects.filter(collaborator__saga=saga, collaborator__name=prompt.worker_name("tester"))
        writer = Run.objects.filter(collaborator__saga=saga, collaborator__name=prompt.worker_name("writer"))
        wait_until(lambda: fake_llm.calls_for("tester-m"), what="the tester's model call")
        wait_until(lambda: writer.filter(status="completed").exists(), what="the writer to finish")
        lead = Collaborator.objects.get(saga=saga, name=prompt.lead_name)
        delegated = set(Delegation.objects.filter(delegator=lead).values_list("pk", "delegate__name"))
        assert sorted(name.split(".", 1)[1] for _, name in delegated) == ["tester", "writer"]

        first.kill()
        # Submitted while no worker runs: its doorbell waits in Redis, which loses it.
        other_saga = create_saga(title="Elsewhere", goal="Another prompt", owner=alice, policy=Saga.Policy.TREE)
        fake_llm.script("writer-m", say("Another changelog."))
        other = submit(client, other_saga, prompt="Write the changelog.", brain="fake", team=["writer"])
        with Redis.from_url(url) as broker:
            assert broker.llen(celery_app.conf.task_default_queue) >= 1
        redis.restart()
        with Redis.from_url(url) as broker:
            assert broker.dbsize() == 0  # every message lost, the new prompt's doorbell with them
        use_broker(url)  # this process's connections went with the old server
        # Down for longer than a lease: the tester's lapses while nothing runs (the crashed worker
        # renews it no more), as it does in any restart slower than AGORA_LEASE_S.
        wait_until(lambda: tester.filter(status="running", lease_until__lt=timezone.now()).exists(),
                   what="the tester's lease to lapse")  # fmt: skip
        replacement = CeleryWorker(url, artifacts, env=runtime_env)

        def over(prompt_id: Any) -> bool:
            return Prompt.objects.get(pk=prompt_id).status != "running"

        wait_until(lambda: over(prompt.pk), timeout=60, what="the prompt the crash cut short to end")
        wait_until(lambda: over(other["prompt_id"]), timeout=30, what="the prompt whose doorbell was lost to end")
    finally:
        fake_llm.gate.set()
        first.kill()
        if replacement is not None:
            replacement.kill()

    prompt.refresh_from_db()
    assert prompt.status == "completed", (prompt.status, prompt.reason)
    assert [(r["role"], r["summary"]) for r in prompt.results] == [
        ("tester", "All pass."), ("writer", "Changelog drafted.")
    ]  # fmt: skip
    assert prompt.answer == "Ship it." and prompt.review is not None and prompt.review["decision"] == "approve"
    assert types(saga).count("plan.created") == 1
    # The support workers' delegations are the first ones; only the primary's and the reviewer's came after.
    after = set(Delegation.objects.filter(delegator=lead).values_list("pk", "delegate__name"))
    assert delegated <= after and sorted(name.split(".", 1)[1] for _, name in after - delegated) == [
        "primary", "review"
    ]  # fmt: skip
    writer_calls = [c for c in fake_llm.calls_for("writer-m") if f"task:{prompt.pk}:writer" in json.dumps(c)]
    assert len(writer_calls) == 1  # finished before the crash: not run again
    assert len(fake_llm.calls_for("tester-m")) == 2  # killed mid-call: its turn ran again
    assert len(fake_llm.calls_for("router-m")) == 1 and len(fake_llm.calls_for("coder-m")) == 1
    resumed = Prompt.objects.get(pk=other["prompt_id"])
    assert resumed.status == "completed" and resumed.answer == "## writer (completed)\nAnother changelog."
