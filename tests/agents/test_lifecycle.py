"""Runs over their lifetime: delegation, wait timeouts, leases, budgets, and the demo saga."""

import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import LazySettings
from django.core.management import call_command
from django.utils import timezone

from accounts.models import User
from agents.actions import load_profiles
from agents.management.commands.seed_demo import A2A_TITLE, DEMO_TITLE
from agents.models import Prompt, TranscriptEntry
from journal.models import JournalEvent
from sagas import actions
from sagas.models import Collaborator, Delegation, HumanRequest, Run, Saga
from sagas.tasks import reconcile
from tests.agents.fake_llm import GATE, FakeLLM, finish_once_answered, say, tool_call
from tests.sagas.kernel import AddAgent, finished
from tests.support import CeleryWorker, wait_until


def test_delegate_creates_a_child_with_its_delegation_and_a_run_started_from_the_handoff(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    task = "Write the changelog for v2."
    fake_llm.script(
        "lead",
        say("", tool_call("delegate", {"name": "writer", "role": "Writer", "task": task, "profile": "p-child"}, "d1")),
        say("Delegated."),
    )
    fake_llm.script("child", say("", tool_call("finish", {"result": "written"}, "f1")))
    load_profiles(entries=[{"name": "p-child", "role": "Writer", "model": "child", "tools": ["finish"]}])
    lead = add_internal("lead", model="lead")

    writer = wait_until(lambda: Collaborator.objects.filter(saga=saga, name="writer").first())
    run = wait_until(lambda: finished(writer), what="the delegate's run to finish")

    assert run.status == Run.Status.COMPLETED and run.result == "written"
    delegation = Delegation.objects.get(delegate=writer)
    assert (delegation.delegator, delegation.task, delegation.status) == (lead, task, "completed")
    handoff = fake_llm.calls_for("child")[0]["messages"][1]["content"]
    assert '<<agora kind="handoff" from="agent:lead">>' in handoff and task in handoff
    assert [t["function"]["name"] for t in fake_llm.calls_for("child")[0]["tools"]] == ["finish"]


def test_a_wait_that_times_out_resumes_with_timed_out_and_the_reply_arrives_later(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga, alice: User
) -> None:
    slow, _ = actions.add_agent(saga=saga, name="slow", role="Slow", task="later", runtime="external", by=alice)
    ask = {"to": "agent:slow", "type": "slow.answer", "payload": {}, "mode": "wait", "timeout_s": 1}
    fake_llm.script("model-a", say("", tool_call("ask_agent", ask, "w1")))
    fake_llm.rule("model-a", finish_once_answered("late reply seen", "f1", meanwhile="Still waiting."))
    ann = add_internal("ann", model="model-a")

    def resumed() -> bool:
        reconcile()  # fires the due wait deadline
        return len(fake_llm.calls_for("model-a")) >= 2

    wait_until(resumed, interval=0.2, what="the wait to time out")
    timed_out = json.loads(fake_llm.calls_for("model-a")[1]["messages"][-1]["content"])
    assert timed_out == {"request_id": timed_out["request_id"], "status": "pending", "timed_out": True}

    actions.reply_to_request(request_id=timed_out["request_id"], by=slow.user, payload={"answer": 42})

    run = wait_until(lambda: finished(ann), what="ann to see the late reply")
    assert run.result == "late reply seen"
    assert '{"answer": 42}' in fake_llm.calls_for("model-a")[-1]["messages"][-1]["content"]


# A model call longer than the lease; heartbeats every 6/3 s leave slack for a busy machine.
@pytest.mark.parametrize("runtime_env", [{"AGORA_LEASE_S": "6", "OPENAI_TIMEOUT_S": "30"}], indirect=True)
def test_the_heartbeat_keeps_a_long_model_call_from_being_reclaimed(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    fake_llm.script("slow", GATE, say("", tool_call("finish", {"result": "slow but sure"}, "f1")))
    ann = add_internal("ann", model="slow")
    wait_until(lambda: fake_llm.calls_for("slow"), what="the model call to start")
    first_lease = Run.objects.get(collaborator=ann).lease_until
    assert first_lease is not None

    def past_the_first_deadline() -> bool:
        reconcile()  # would reclaim the run if its lease had lapsed
        run = Run.objects.get(collaborator=ann)
        assert (run.status, run.turn) == (Run.Status.RUNNING, 1)
        return timezone.now() > first_lease + timedelta(seconds=1)

    wait_until(past_the_first_deadline, interval=0.3, what="the model call to outlast its first lease")
    fake_llm.gate.set()

    run = wait_until(lambda: finished(ann))
    assert (run.status, run.turn) == (Run.Status.COMPLETED, 1)
    assert len(fake_llm.calls_for("slow")) == 1
    assert JournalEvent.objects.filter(saga=saga, type="llm_call").count() == 1


def test_a_turn_budget_stops_a_runaway_run_with_a_clear_reason(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    fake_llm.rule("loop", lambda body: say("", tool_call("get_collaborators", {})))
    ann = add_internal("ann", model="loop", max_turns=3)

    run = wait_until(lambda: finished(ann))

    assert (run.status, run.error) == (Run.Status.FAILED, "Turn budget of 3 turns exhausted.")
    assert len(fake_llm.calls_for("loop")) == 3
    assert JournalEvent.objects.get(saga=saga, type="worker_end").data["error"] == run.error


@pytest.mark.django_db(transaction=True)
def test_a_turn_its_dead_worker_lost_is_not_counted_against_the_turn_budget(
    saga: Saga, alice: User, model_here: FakeLLM, settings: LazySettings
) -> None:
    from agents.executor import run_turn
    from sagas.actions import claim_turn, reclaim_lapsed_turn

    model_here.script("once-m", say("", tool_call("finish", {"result": "done"})))
    load_profiles(entries=[{"name": "p-once", "role": "Once", "model": "once-m", "tools": ["finish"], "max_turns": 1}])
    once, _ = actions.add_agent(saga=saga, name="once", role="Once", task="Once.", runtime="internal",
                                profile="p-once", by=alice)  # fmt: skip
    lost = claim_turn(run_id=once.run.pk, worker="w1@dead-host")  # its worker dies with the turn
    assert lost is not None and lost.turn == 1
    lapsed = timezone.now() + timedelta(seconds=settings.AGORA_LEASE_S + 1)
    assert reclaim_lapsed_turn(run_id=lost.pk, now=lapsed, mark=timezone.now())

    run_turn(lost.pk)  # turn 2 makes turn 1 again: the one turn of its budget

    run = Run.objects.get(pk=lost.pk)
    assert (run.status, run.result, run.error, run.turn, run.reclaims) == (Run.Status.COMPLETED, "done", "", 2, 1)
    assert len(model_here.calls_for("once-m")) == 1


def test_a_token_budget_stops_a_run(worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent) -> None:
    fake_llm.rule("loop", lambda body: say("", tool_call("get_collaborators", {})))
    ann = add_internal("ann", model="loop", max_tokens=30)  # the fake reports 18 tokens a call

    run = wait_until(lambda: finished(ann))

    assert (run.status, run.error) == (Run.Status.FAILED, "Token budget of 30 tokens exhausted.")
    assert sum(TranscriptEntry.objects.filter(run=run).values_list("tokens", flat=True)) == 36


def test_the_demo_saga_plays_out_with_the_scripted_agents(worker: CeleryWorker, transactional_db: Any) -> None:
    demo = User.objects.create_user("demo", password="demo-password", is_staff=True, is_superuser=True)
    call_command("seed_demo")
    saga = Saga.objects.get(owner=demo, title=DEMO_TITLE)

    form = wait_until(lambda: HumanRequest.objects.filter(saga=saga).first(), timeout=30, what="the demo's question")
    writer = Collaborator.objects.get(saga=saga, name="docs-writer")
    wait_until(lambda: finished(writer))

    def completed_types() -> set[str]:
        return set(saga.requests.filter(status="completed").values_list("type", flat=True))

    # The review is asked asynchronously and answered in the reviewer's own time.
    wait_until(lambda: completed_types() >= {"test.plan", "code.review", "changelog.ready"}, what="every reply")
    assert form.addressee.handle == "human:demo" and form.status == "pending"
    # The team: both teammates answered the lead's broadcast, and the checker was let go.
    wait_until(lambda: saga.requests.filter(type="team.reply", status="completed").count() == 2, what="the team")
    checker = Collaborator.objects.get(saga=saga, name="checker")
    wait_until(lambda: Run.objects.get(collaborator=checker).status == Run.Status.SHUTDOWN, what="the shutdown")
    assert {c.handle for c in Collaborator.objects.filter(saga=saga).exclude(name__startswith="brain-")} == {
        "human:demo", "agent:coder", "agent:tester", "agent:reviewer", "agent:docs-writer", "agent:lead",
        "agent:scout", "agent:checker",
    }  # fmt: skip
    # Beside them, one orchestration: three workers, a primary and a review, all scripted.
    prompt = wait_until(lambda: Prompt.objects.filter(saga=saga).exclude(status="running").first(), timeout=30)
    assert prompt.status == "completed" and len(prompt.results) == 3 and prompt.answer
    assert prompt.review is not None and prompt.review["decision"] == "approve"
    types = set(JournalEvent.objects.filter(saga=saga).values_list("type", flat=True))
    assert {"worker_start", "llm_call", "request.created", "request.completed", "human_request.created"} <= types

    call_command("seed_demo")  # a second `make run` adds nothing
    assert Saga.objects.filter(owner=demo).count() == 2  # this one and "Demo: A2A", with its exposed agents
    assert Prompt.objects.count() == 1
    a2a = Collaborator.objects.filter(saga__title=A2A_TITLE, kind="agent", exposed=True)
    assert sorted(a2a.values_list("name", "profile")) == [("asker", "asker"), ("chat", "chat"), ("echo", "responder")]
