"""The orchestrator's steps advanced in this process, no worker running them: when an idle worker
counts as done, routing a prompt with images, the routing lease, a saga that finished, the periodic
resume, the routing task running the first support worker itself, the compare-and-set that makes a
stale step write nothing, and what a worker's ending transaction reads for the step it makes ready."""

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import LazySettings
from rest_framework.test import APIClient

from accounts.models import User
from agents.actions import load_profiles
from agents.orchestrator.actions import load_brains
from agents.orchestrator.models import Prompt
from journal.models import JournalEvent
from sagas.models import Collaborator, Delegation, Saga
from tests.agents.orchestration_support import submit, types


@pytest.mark.parametrize("asked", ["an agent", "a person", "a remote agent"])
def test_an_idle_worker_is_done_once_nothing_it_asked_is_open(
    default_brain: None, saga: Saga, alice: User, asked: str
) -> None:
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.plans import forced_plan
    from agents.orchestrator.reads import outcomes, read_prompt
    from agents.tools import Call, execute
    from sagas import actions
    from sagas.models import AgentRequest, Run
    from sagas.remotes import RemoteCall

    prompt, _ = submit_prompt(saga=saga, by=alice, text="Do it")  # no worker: nothing runs it
    lead = prompt.lead
    assert lead is not None
    tester, _ = actions.add_agent(
        saga=saga, name=prompt.worker_name("tester"), role="Tester", task="Test it.", runtime="internal", by=alice,
        profile="brain-tester", parent=lead.handle, ring=False,
    )  # fmt: skip
    Run.objects.filter(collaborator=tester).update(status=Run.Status.IDLE)
    Prompt.objects.filter(pk=prompt.pk).update(plan=forced_plan(["tester"]), step=Prompt.Step.WORKERS)
    page = Client()
    page.force_login(alice)

    def done() -> bool:
        """Whether the step takes its worker's answer, as the plan view shows it (answered, waiting)."""
        read = read_prompt(str(prompt.pk))
        assert read is not None
        html = page.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
        (shown,) = re.findall(r'data-role="tester" data-status="(\w+)"', html)
        taken = "tester" in outcomes(read, ["tester"])
        assert shown == ("answered" if taken else "waiting")
        return taken

    assert done()  # idle, nothing asked: its last text is its answer
    if asked == "an agent":
        # Not its lead, which answers none: its ask_agent tool refuses that, with a word on what to do.
        to_lead = json.dumps({"to": lead.handle, "type": "question", "payload": {}})
        refused = execute(Call(run=tester.run, collaborator=tester, turn=1, call_id="c1"), "ask_agent", to_lead,
                          ["ask_agent"]).result or {}  # fmt: skip
        assert refused["error"]["code"] == "recipient_unavailable" and "ask_human" in refused["error"]["message"]
        assert done() and not AgentRequest.objects.filter(sender=tester).exists()
        writer, _ = actions.add_agent(
            saga=saga, name=prompt.worker_name("writer"), role="Writer", task="Write it.", runtime="internal",
            by=alice, profile="brain-writer", parent=lead.handle, ring=False,
        )  # fmt: skip
        question, _ = actions.ask_agent(sender=tester, to=writer.handle, type="question", payload={})
        assert not done()
        actions.reply_to_request(request_id=question.pk, by=writer.user, payload={"answer": 42})
    elif asked == "a person":
        form, _ = actions.ask_human(asker=tester, title="Which?", fields=[{"name": "which", "label": "Which"}])
        assert not done()
        actions.answer_human_request(human_request_id=form.pk, answer={"which": "this"}, by=alice)
    else:
        now = timezone.now()
        call = RemoteCall.objects.create(
            saga=saga, caller=tester, agent_name="far", url="https://far.example/a2a", message="Hi",
            deadline=now + timedelta(minutes=5), next_step_at=now,
        )  # fmt: skip
        assert not done()
        actions.settle_remote_call(call_id=call.pk, status="completed", reply="Hello")
    # The answer woke it; once its turn on the answer leaves it idle, it is done.
    assert Run.objects.filter(collaborator=tester, status=Run.Status.QUEUED).update(status=Run.Status.IDLE) == 1
    assert done()


def test_a_prompt_with_images_routes_only_to_roles_that_can_see_them(
    saga: Saga, alice: User, settings: LazySettings
) -> None:
    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the routing step runs hooks (none here), in this process

    eyes = {"m-vision": ["vision"]}
    load_profiles(
        entries=[
            {"name": "v-router", "role": "Router", "model": "m-text", "tools": ["finish"]},
            {"name": "v-coder", "role": "Coder", "model": "m-text", "tools": ["finish"]},
            {"name": "v-tester", "role": "Tester", "model": "m-text", "fallback_models": ["m-vision"],
             "model_capabilities": eyes, "tools": ["finish"]},
        ]
    )  # fmt: skip
    load_brains(
        entries=[
            {"name": "v", "planner_profile": "v-router", "roles": {"coder": "v-coder", "tester": "v-tester"},
             "signals": {"coder": ["implement"], "tester": ["screenshot"]}, "default_primary": "coder",
             "review_role": ""}
        ]
    )  # fmt: skip
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement what this screenshot shows.", brain="v",
                              images=["https://example.test/shot.png"])  # fmt: skip

    steps.advance(str(prompt.pk))  # in this process: routing, then (no support worker) the primary starts

    prompt.refresh_from_db()
    assert prompt.step == "primary" and prompt.plan is not None
    assert Collaborator.objects.get(saga=saga, name=prompt.worker_name("primary")).profile == "v-tester"
    assert prompt.plan["source"] == "heuristic" and "every router candidate failed" in prompt.plan["router_error"]
    assert prompt.plan["primary_role"] == "tester" and prompt.plan["workers"] == []  # the coder cannot see
    assert "model_skipped" in types(saga)


def test_one_routing_at_a_time_until_its_lease_lapses(default_brain: None, saga: Saga, alice: User) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.hooking import claim_routing

    prompt, _ = submit_prompt(saga=saga, by=alice, text="Do it")
    assert claim_routing(prompt) is True
    assert claim_routing(prompt) is False  # a second doorbell meanwhile does not call the router
    Prompt.objects.filter(pk=prompt.pk).update(step_until=timezone.now() - timedelta(seconds=1))
    assert claim_routing(prompt) is True  # the first one's worker died: the lease lapsed


def test_an_orchestration_whose_saga_finished_ends_at_its_next_step_and_starts_nothing(
    default_brain: None, saga: Saga, alice: User, client_for: Callable[[User], APIClient]
) -> None:
    from agents.orchestrator import steps
    from sagas import actions
    from sagas.models import Run

    prompt_id = submit(client_for(alice), saga, prompt="Do it")["prompt_id"]  # no worker: it waits to be routed
    actions.finish_saga(saga=saga, status="completed", by=alice)

    steps.advance(prompt_id)  # what the periodic resume would run

    prompt = Prompt.objects.get(pk=prompt_id)
    assert (prompt.status, prompt.step, prompt.reason) == ("failed", "done", "The saga was completed.")
    assert Run.objects.get(collaborator=prompt.lead).status == Run.Status.CANCELLED
    assert not Delegation.objects.filter(delegator=prompt.lead).exists()
    assert types(saga)[-1] == "prompt.failed"


def queued(redis_url: str, task: str, *, take: bool = False) -> list[str]:
    """The first argument of each `task` message waiting in the broker (no worker runs here), in
    any order; `take` removes every message."""
    import base64

    from redis import Redis

    with Redis.from_url(redis_url) as client:
        messages = [json.loads(raw) for raw in client.lrange("celery", 0, -1)]
        if take:
            client.delete("celery")
    return sorted(json.loads(base64.b64decode(m["body"]))[0][0] for m in messages if m["headers"]["task"] == task)


def test_the_periodic_resume_leaves_fresh_orchestrations_alone(
    default_brain: None, saga: Saga, alice: User, redis_url: str, settings: LazySettings
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from agents.orchestrator.actions import ADVANCE_TASK, submit_prompt
    from agents.orchestrator.tasks import resume_prompts

    fresh, _ = submit_prompt(saga=saga, by=alice, text="Do it")
    stale, _ = submit_prompt(saga=saga, by=alice, text="Do that")
    long_ago = timezone.now() - timedelta(seconds=settings.AGORA_RERING_S + 1)
    Prompt.objects.filter(pk=stale.pk).update(updated_at=long_ago)  # nothing moved it since
    queued(redis_url, ADVANCE_TASK, take=True)  # the submissions' own doorbells

    assert resume_prompts() == 1
    assert queued(redis_url, ADVANCE_TASK, take=True) == [str(stale.pk)]
    assert resume_prompts() == 0  # rung: touched, so not again before AGORA_RERING_S
    # At a worker's start (a restart after a crash) every running one is rung.
    assert resume_prompts(everything=True) == 2
    assert queued(redis_url, ADVANCE_TASK) == sorted([str(fresh.pk), str(stale.pk)])


def test_the_routing_task_runs_the_first_support_worker_itself(
    fake_brain: None, saga: Saga, alice: User, redis_url: str, settings: LazySettings
) -> None:
    """The first support worker costs no Celery hand-off and no claim of its own: its run is
    claimed for the task that routed, in the routing step's transaction, and handed back to run;
    only the others' first turns are queued. A task that dies before it runs it loses nothing:
    the lease lapses, and the reconciler queues the run again."""
    from datetime import timedelta

    from django.utils import timezone

    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt
    from sagas.models import Run
    from sagas.tasks import reconcile
    from sagas.wakeups import RUN_TURN_TASK

    settings.AGORA_HOOKS_INLINE = True  # the routing step runs hooks (none here), in this process
    # Forced roles: no router call, the same support workers.
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake", team=["tester", "writer"])

    here = steps.advance(str(prompt.pk), worker="w1@host")

    tester, writer = (Collaborator.objects.get(saga=saga, name=prompt.worker_name(r)) for r in ("tester", "writer"))
    assert [turns.run.pk for turns in here] == [tester.run.pk]
    assert queued(redis_url, RUN_TURN_TASK, take=True) == [writer.run.pk]
    assert (tester.run.status, tester.run.turn, tester.run.worker) == ("running", 1, "w1@host")
    assert writer.run.status == "queued"
    started = JournalEvent.objects.filter(saga=saga, type="worker_start").values_list("actor", "data__worker")
    assert list(started) == [(tester.handle, "w1@host")]  # its turn began in that transaction

    # w1 dies before it runs the turn: once the lease lapses, the run is queued again and rung.
    Run.objects.filter(pk=tester.run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    reconcile()
    assert Run.objects.get(pk=tester.run.pk).status == "queued"
    assert tester.run.pk in queued(redis_url, RUN_TURN_TASK)


def test_a_step_whose_copy_is_stale_loses_its_compare_and_set_and_writes_nothing(
    fake_brain: None, saga: Saga, alice: User, redis_url: str, settings: LazySettings
) -> None:
    """Two doorbells for one ready step (a redelivery, a re-ring): the one that moves second finds
    the prompt moved, and its transaction writes nothing (on PostgreSQL the server fails it:
    agora_step_moved)."""
    from agents.orchestrator import reads, steps
    from agents.orchestrator.actions import submit_prompt
    from sagas import actions
    from sagas.models import Run

    settings.AGORA_HOOKS_INLINE = True  # the steps run hooks (none here), in this process
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement it.", brain="fake", team=["tester", "writer"])
    steps.advance(str(prompt.pk))  # routed: both support workers delegated
    for role in ("tester", "writer"):  # and both answered
        run = Run.objects.select_related("collaborator").get(collaborator__saga=saga,
                                                             collaborator__name=prompt.worker_name(role))  # fmt: skip
        actions.finish_run(run=run, status="completed", result={"summary": f"{role} done"})
    stale = reads.read_prompt(str(prompt.pk))  # read by the second doorbell, before the first moves it

    assert steps.advance(str(prompt.pk)) == []  # the first: the team's answer
    written = types(saga)
    assert written.count("prompt.completed") == 1

    assert steps.advance(str(prompt.pk), stale) == []  # the second, with its copy still at `workers`
    assert types(saga) == written
    after = Prompt.objects.get(pk=prompt.pk)
    assert (after.status, after.step) == ("completed", "done")
    assert after.answer == "## tester (completed)\ntester done\n\n## writer (completed)\nwriter done"


def test_a_workers_ending_transaction_reads_what_the_step_it_makes_ready_needs(
    default_brain: None, saga: Saga, alice: User, redis_url: str, settings: LazySettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The transaction that ends a prompt's worker's task reads, with its COMMIT, the running
    prompts of its lead and its fellow workers' runs: the step it makes ready (or finds unready)
    reads neither again, nor the prompt once the step has concluded it (on PostgreSQL: no round trip
    for any of them)."""
    from agents.executor import run_claimed, run_turn
    from agents.orchestrator import reads, steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the steps run hooks (none here), in this process
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Test and document it.", team=["tester", "writer"])
    (tester,) = steps.advance(str(prompt.pk), worker="w1@host")  # the writer's first turn is queued
    writer = Collaborator.objects.get(saga=saga, name=prompt.worker_name("writer"))

    fetched: list[str] = []
    fetch = reads.fetch

    def fetch_noted(sql: str, *args: Any, **kwargs: Any) -> list[list[Any]]:
        fetched.append(sql)
        return fetch(sql, *args, **kwargs)

    monkeypatch.setattr(reads, "fetch", fetch_noted)
    monkeypatch.setattr(reads, "running_prompts", None)  # called: a TypeError

    run_turn(writer.run.pk, worker="w2@host")  # ends first: its step is not ready
    assert Prompt.objects.get(pk=prompt.pk).step == "workers"
    run_claimed(tester)  # ends last: the team's answer
    done = Prompt.objects.get(pk=prompt.pk)
    assert (done.status, [r["role"] for r in done.results]) == ("completed", ["tester", "writer"])
    assert fetched == []  # the outcomes came with the endings, and the prompt they ended is not read again


def test_the_step_that_starts_the_primary_has_its_profile_read_with_the_last_workers_ending(
    default_brain: None, saga: Saga, alice: User, redis_url: str, settings: LazySettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The primary role's profile (its MCP servers, checked before the primary starts) comes, on
    PostgreSQL, with what the last worker's ending transaction reads for the step: no round trip of
    its own. Elsewhere, where a read costs none, the step reads it."""
    from django.db import connection

    from agents.executor import run_claimed, run_turn
    from agents.orchestrator import steps
    from agents.orchestrator.actions import submit_prompt

    settings.AGORA_HOOKS_INLINE = True  # the steps run hooks (none here), in this process
    prompt, _ = submit_prompt(saga=saga, by=alice, text="Implement the endpoint, with tests and docs.")
    read: list[str] = []
    profile_named = steps.profile_named

    def profile_noted(name: str) -> Any:
        read.append(name)
        return profile_named(name)

    monkeypatch.setattr(steps, "profile_named", profile_noted)

    (first,) = steps.advance(str(prompt.pk), worker="w1@host")  # routed; the other workers are queued
    workers = Collaborator.objects.filter(saga=saga, name__startswith=f"{prompt.lead_name}.")
    for run_id in workers.exclude(run__pk=first.run.pk).values_list("run__pk", flat=True):
        run_turn(run_id, worker="w2@host")
    run_claimed(first)  # ends last: the primary starts, and runs here, then the reviewer

    done = Prompt.objects.get(pk=prompt.pk)
    assert done.status == "completed" and (done.plan or {}).get("primary_role") == "coder", done.reason
    assert Collaborator.objects.filter(saga=saga, name=done.worker_name("primary"), role="coder").exists()
    assert read == ([] if connection.vendor == "postgresql" else ["brain-coder"])


@pytest.mark.parametrize("policy", [Saga.Policy.HUB, Saga.Policy.TREE])
def test_an_agent_named_brain_something_is_asked_as_any_other(default_brain: None, alice: User, policy: str) -> None:
    """Only a prompt's lead takes no questions from its workers: `brain-` in a name reserves
    nothing, and an agent's delegate asks it (under `hub`, the one agent it may address)."""
    from agents.tools import Call, execute
    from sagas import actions
    from sagas.models import AgentRequest, Run

    saga = actions.create_saga(title="Ops", goal="Run ops", owner=alice, policy=policy)
    actions.add_agent(saga=saga, name="brain-ops", role="Ops", task="t", runtime="external", by=alice)
    helper, _ = actions.add_agent(saga=saga, name="brain-ops.helper", role="Helper", task="t", runtime="external",
                                  parent="agent:brain-ops", by=alice)  # fmt: skip
    call = Call(run=Run.objects.get(collaborator=helper), collaborator=helper, turn=1, call_id="c1")

    asked = execute(call, "ask_agent", json.dumps({"to": "agent:brain-ops", "type": "q", "payload": {}}), ["ask_agent"])

    assert (asked.result or {}).get("status") == "pending", asked.result
    assert AgentRequest.objects.filter(sender=helper, recipient__name="brain-ops").count() == 1
