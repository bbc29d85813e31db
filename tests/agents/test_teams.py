"""Persistent teams through a real Celery worker: a lead spawns teammates that idle between tasks,
broadcasts to them, collects their answers and shuts one down."""

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from accounts.models import User
from agents.actions import load_profiles
from sagas import actions, errors
from sagas.models import AgentRequest, Broadcast, Collaborator, Run, Saga, SteeringItem
from sagas.tasks import reconcile
from tests.agents.fake_llm import GATE, FakeLLM, say, tool_call
from tests.sagas.kernel import events_of
from tests.support import CeleryWorker, wait_until

PROFILES = Path(__file__).resolve().parents[2] / "agents" / "profiles" / "default.json"


@pytest.fixture
def profiles(transactional_db: None) -> None:
    call_command("load_profiles", str(PROFILES))


def run_of(collaborator: Collaborator) -> Run:
    return Run.objects.get(collaborator=collaborator)


def agent(saga: Saga, name: str) -> Collaborator | None:
    return Collaborator.objects.filter(saga=saga, kind="agent", name=name).first()


def test_a_lead_spawns_teammates_that_idle_wake_on_its_broadcast_answer_and_one_is_shut_down(
    worker: CeleryWorker, profiles: None, saga: Saga, alice: User
) -> None:
    lead, _ = actions.add_agent(
        saga=saga, name="lead", role="Lead", task="Run the team.", runtime="internal", profile="team-lead", by=alice
    )

    def replies_answered() -> list[AgentRequest] | None:
        done = list(AgentRequest.objects.filter(recipient=lead, type="team.reply", status="completed"))
        return done if len(done) == 2 else None

    answered = wait_until(replies_answered, timeout=60, what="both teammates' answers to be answered")
    checker = wait_until(lambda: agent(saga, "checker"), what="checker")
    scout = agent(saga, "scout")
    assert scout is not None
    wait_until(lambda: run_of(checker).status == Run.Status.SHUTDOWN, timeout=30, what="checker's shutdown")
    wait_until(lambda: run_of(scout).status == Run.Status.IDLE, timeout=30, what="scout to idle again")

    # A teammate idles instead of finishing (its `finish` did not end it). The checker may still be at
    # its prompt when the broadcast reaches it, and then goes on without idling: only the scout,
    # which idled again above, is sure to have.
    assert [e for e in events_of(saga, "run.idle") if e.actor == scout.handle], "the scout never idled"
    for mate in (scout, checker):
        assert mate.delegation.delegator == lead and run_of(mate).team is not None
    (sent,) = Broadcast.objects.all()
    assert sent.recipients == ["agent:scout", "agent:checker"]
    for mate in (scout, checker):
        items = SteeringItem.objects.filter(recipient=mate, broadcast=sent)
        assert items.count() == 1 and items.get().consumed_at is not None
    assert {r.sender.handle for r in answered} == {"agent:scout", "agent:checker"}
    assert all(r.payload["broadcast_id"] == sent.pk for r in answered)
    (event,) = events_of(saga, "team.broadcast")
    assert event.actor == "agent:lead" and event.data["recipients"] == sent.recipients
    (shutdown,) = events_of(saga, "run.shutdown")
    assert shutdown.actor == "agent:lead" and shutdown.run_id == run_of(checker).pk

    team = actions.team_of(saga, "agent:lead")
    roster = {m.id: m for m in actions.roster(team)}
    assert (roster["agent:scout"].status, roster["agent:checker"].status) == ("idle", "shutdown")
    assert roster["agent:scout"].turns >= 2 and roster["agent:checker"].current_task == ""
    inbox, unread = actions.lead_inbox(team)
    assert {i.sender for i in inbox if i.kind == "request"} == {"agent:scout", "agent:checker"} and unread == 0
    cards = {c["id"]: c for c in actions_cards(lead)}
    assert cards["agent:checker"]["team_status"] == "shutdown" and cards["agent:scout"]["team_status"] == "idle"

    # Shut down is final: nothing wakes it, and asking it fails at once.
    with pytest.raises(errors.RecipientUnavailable):
        actions.ask_agent(sender=lead, to="agent:checker", type="more.work", payload={})
    actions.broadcast(lead=lead, content="phase 2", by=alice)
    assert SteeringItem.objects.filter(recipient=checker).filter(payload="phase 2").count() == 0


def actions_cards(lead: Collaborator) -> list[dict[str, Any]]:
    from sagas.access import collaborator_card, visible_collaborators

    return [collaborator_card(c) for c in visible_collaborators(lead)]


def test_shutdown_fails_what_was_asked_of_the_teammate_and_cancels_what_it_asked(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User
) -> None:
    load_profiles(entries=[{"name": "mate", "role": "Mate", "model": "mate", "tools": ["ask_agent", "finish"]}])
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="lead", runtime="external", by=alice)
    ask = tool_call("ask_agent", {"to": "agent:lead", "type": "need.data", "payload": {}})
    # Its turn on the lead's request holds in its model call until the roster has been read.
    fake_llm.script("mate", say("", ask), say("Waiting for more."), GATE)
    fake_llm.rule("mate", lambda body: say("Waiting for more."))
    mate, created = actions.spawn_teammate(
        lead=lead, name="mate", role="Mate", prompt="Work.", profile="mate", by=lead.user, idempotency_key="k1"
    )
    assert created
    outbound = wait_until(lambda: AgentRequest.objects.filter(sender=mate).first(), what="the teammate's ask")
    wait_until(lambda: run_of(mate).status == Run.Status.IDLE, what="the teammate to idle")
    inbound, _ = actions.ask_agent(sender=lead, to="agent:mate", type="slow.task", payload={"n": 1})

    # The budgets: teammates at work, and the tokens the team has used (the fake model's 18 a call).
    team = actions.team_of(saga, "agent:lead")
    (card,) = actions.roster(team)
    assert card.tokens >= 18 and card.status == "working"
    fake_llm.gate.set()
    wait_until(lambda: run_of(mate).status == Run.Status.IDLE and len(fake_llm.calls_for("mate")) == 3,
               what="the teammate's turn on the request")  # fmt: skip
    spawn_more: dict[str, Any] = {
        "lead": lead,
        "name": "more",
        "role": "Mate",
        "prompt": "p",
        "profile": "mate",
        "by": alice,
    }
    type(team).objects.filter(pk=team.pk).update(max_teammates=1)
    with pytest.raises(errors.TeamFull):
        actions.spawn_teammate(**spawn_more)
    assert agent(saga, "more") is None

    run = actions.shutdown_teammate(teammate=mate, reason="Done with you.", by=lead.user)

    assert run.status == Run.Status.SHUTDOWN and run.error == "Done with you."
    inbound.refresh_from_db()
    outbound.refresh_from_db()
    assert inbound.status == AgentRequest.Status.RECIPIENT_UNAVAILABLE
    assert outbound.status == AgentRequest.Status.CANCELLED
    assert SteeringItem.objects.filter(recipient=lead, request=inbound, kind="notice").count() == 1
    # A second shutdown, or a retried spawn with the same key, changes nothing.
    assert actions.shutdown_teammate(teammate=mate, reason="again", by=alice).error == "Done with you."
    again, created = actions.spawn_teammate(
        lead=lead, name="mate", role="Mate", prompt="Work.", profile="mate", by=lead.user, idempotency_key="k1"
    )
    assert (again, created) == (mate, False)
    reconcile()
    assert run_of(mate).status == Run.Status.SHUTDOWN

    # Tokens spent count against the team after its teammates end (set here, with no teammate at
    # work: a working one would be stopped by the same budget at its next turn).
    type(team).objects.filter(pk=team.pk).update(max_teammates=5, max_tokens=18)
    with pytest.raises(errors.TeamBudgetExhausted):
        actions.spawn_teammate(**spawn_more)
    assert agent(saga, "more") is None


@pytest.mark.parametrize("runtime_env", [{"OPENAI_TIMEOUT_S": "60"}], indirect=True)
def test_a_worker_killed_during_a_broadcast_loses_nothing_and_duplicates_nothing(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, settings: Any
) -> None:
    settings.AGORA_TEAM_MAX_TEAMMATES = 40
    load_profiles(entries=[
        {"name": "quiet", "role": "Mate", "model": "scripted:team-mate", "tools": ["finish"], "max_turns": 100},
        {"name": "boss", "role": "Lead", "model": "boss", "tools": ["broadcast"]},
    ])  # fmt: skip
    call = tool_call("broadcast", {"content": {"go": True}}, "b1")
    fake_llm.script("boss", GATE, say("", call), say("", call))
    fake_llm.rule("boss", lambda body: say("Broadcast sent."))
    with transaction.atomic():  # the lead's first turn starts once all its teammates are there
        boss, _ = actions.add_agent(
            saga=saga, name="boss", role="Lead", task="t", runtime="internal", profile="boss", by=alice
        )
        mates = [
            actions.spawn_teammate(lead=boss, name=f"m{i}", role="Mate", prompt="p", profile="quiet", by=alice)[0]
            for i in range(30)
        ]
    wait_until(lambda: len(fake_llm.calls_for("boss")) == 1, timeout=60, what="the lead's model call")

    fake_llm.gate.set()  # the broadcast's transaction starts now; the worker dies around it
    worker.kill()
    worker.start()

    def delivered() -> bool:
        reconcile()  # reclaims the lapsed turn of the killed worker
        return Broadcast.objects.count() == 1 and run_of(boss).status == Run.Status.IDLE

    wait_until(delivered, timeout=90, interval=0.5, what="the broadcast, once")
    (sent,) = Broadcast.objects.all()
    assert len(sent.recipients) == 30
    for mate in mates:
        assert SteeringItem.objects.filter(recipient=mate, broadcast=sent).count() == 1
    assert len(events_of(saga, "team.broadcast")) == 1


@pytest.mark.parametrize("runtime_env", [{"OPENAI_TIMEOUT_S": "60"}], indirect=True)
@pytest.mark.parametrize("ending", ["shut down", "lead finished"])
def test_a_teammate_shut_down_during_its_model_call_does_nothing_more(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, ending: str
) -> None:
    """By its lead, or because its lead ended: the worker drops the turn at its next write."""
    load_profiles(entries=[{"name": "busy", "role": "Mate", "model": "busy", "tools": ["ask_agent", "finish"]}])
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="lead", runtime="external", by=alice)
    late = tool_call("ask_agent", {"to": "agent:lead", "type": "too.late", "payload": {}}, "late")
    fake_llm.script("busy", GATE, say("", late))
    mate, _ = actions.spawn_teammate(lead=lead, name="busy", role="Mate", prompt="p", profile="busy", by=alice)
    wait_until(lambda: len(fake_llm.calls_for("busy")) == 1, what="the teammate's model call")

    if ending == "shut down":
        actions.shutdown_teammate(teammate=mate, reason="Stop now.", by=lead.user)
    else:
        actions.set_external_status(run_id=lead.run.pk, status="finished", by=lead.user)
    fake_llm.gate.set()  # the model answers after the shutdown: its tool call must not happen

    def worker_gave_up() -> bool:
        return "is another worker's; stopping" in worker.log()

    wait_until(worker_gave_up, timeout=30, what="the worker to drop the turn")
    reason = "Stop now." if ending == "shut down" else "The team's lead agent:lead ended (completed)."
    assert (run_of(mate).status, run_of(mate).error) == (Run.Status.SHUTDOWN, reason)
    assert not AgentRequest.objects.filter(sender=mate).exists()
    assert not events_of(saga, "llm_call")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs row locks: SQLite locks the whole database")
@pytest.mark.parametrize("runtime_env", [{"OPENAI_TIMEOUT_S": "60"}], indirect=True)
def test_a_worker_killed_halfway_through_a_broadcast_rolls_it_back_and_the_retry_delivers_it_once(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, settings: Any
) -> None:
    settings.AGORA_TEAM_MAX_TEAMMATES = 40
    load_profiles(entries=[
        {"name": "quiet", "role": "Mate", "model": "scripted:team-mate", "tools": ["finish"], "max_turns": 100},
        {"name": "boss", "role": "Lead", "model": "boss", "tools": ["broadcast"]},
    ])  # fmt: skip
    call = tool_call("broadcast", {"content": {"go": True}}, "b1")
    fake_llm.script("boss", GATE, say("", call), say("", call))
    fake_llm.rule("boss", lambda body: say("Broadcast sent."))
    with transaction.atomic():
        boss, _ = actions.add_agent(
            saga=saga, name="boss", role="Lead", task="t", runtime="internal", profile="boss", by=alice
        )
        mates = [
            actions.spawn_teammate(lead=boss, name=f"m{i:02}", role="Mate", prompt="p", profile="quiet", by=alice)[0]
            for i in range(30)
        ]
    wait_until(lambda: len(fake_llm.calls_for("boss")) == 1, timeout=60, what="the lead's model call")

    # Hold the 16th teammate's row: the broadcast writes 15 items, then blocks on the 16th, inside
    # its one transaction; the worker is killed right there.
    locked, done = threading.Event(), threading.Event()

    def hold_a_teammate() -> None:
        with transaction.atomic():
            Collaborator.objects.select_for_update(no_key=True).get(pk=mates[15].pk)
            locked.set()
            done.wait(60)
        connections.close_all()

    holder = threading.Thread(target=hold_a_teammate)
    holder.start()
    try:
        assert locked.wait(10)
        fake_llm.gate.set()
        with connection.cursor() as cursor:
            # The broadcast's own statement, not some teammate's turn queueing for the saga.
            blocked = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
            wait_until(
                lambda: cursor.execute(blocked, ["%steering_seq + 1%"]) or cursor.fetchone()[0] > 0,
                what="the broadcast to block",
            )
        assert not Broadcast.objects.exists()
        worker.kill()
    finally:
        done.set()
        holder.join()
    worker.start()

    def delivered() -> bool:
        reconcile()
        return Broadcast.objects.count() == 1 and run_of(boss).status == Run.Status.IDLE

    wait_until(delivered, timeout=90, interval=0.5, what="the broadcast, once")
    (sent,) = Broadcast.objects.all()
    assert sent.recipients == [m.handle for m in mates]
    for mate in mates:
        assert SteeringItem.objects.filter(recipient=mate, broadcast=sent).count() == 1
    assert SteeringItem.objects.filter(broadcast__isnull=False).count() == 30
    assert len(events_of(saga, "team.broadcast")) == 1


@pytest.mark.django_db(transaction=True)
def test_a_teammates_finish_ends_its_turn_and_leaves_it_idle(saga: Saga, alice: User, model_here: FakeLLM) -> None:
    """Its result goes back to the model as the call's result, and the turn ends there (calls
    after it in the message are not made): it went on to another model call, and a model that
    called finish again each time was asked until max_turns failed the teammate."""
    from agents.executor import run_turn
    from agents.transcripts import Transcript

    again = tool_call("finish", {"result": "Again."}, "c2")
    model_here.rule("mate-m", lambda body: say("", tool_call("finish", {"result": "Ready."}, "c1"), again))
    load_profiles(entries=[{"name": "mate", "role": "Mate", "model": "mate-m", "tools": ["finish"], "max_turns": 4}])
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="lead", runtime="external", by=alice)
    mate, _ = actions.spawn_teammate(lead=lead, name="mate", role="Mate", prompt="Work.", profile="mate", by=lead.user)

    for _ in range(3):  # a task's time slice may end between turns: the run would queue again
        run_turn(mate.run.pk)

    run = Run.objects.get(pk=mate.run.pk)
    assert (run.status, len(model_here.calls_for("mate-m"))) == (Run.Status.IDLE, 1), run.error
    transcript = Transcript(run.pk)
    transcript.read_new()
    results = {m["tool_call_id"]: json.loads(m["content"]) for m in transcript.messages if m["role"] == "tool"}
    assert results["c1"] == {"status": "idle", "result": "Ready."}
    assert results["c2"]["error"]["code"] == "not_run"  # every call has its result: the next request is valid

    actions.broadcast(lead=lead, content={"task": "Next."}, by=lead.user)  # steering wakes it
    run_turn(mate.run.pk)

    assert len(model_here.calls_for("mate-m")) == 2 and Run.objects.get(pk=mate.run.pk).status == Run.Status.IDLE
    assert "Next." in json.dumps(model_here.calls_for("mate-m")[-1]["messages"][-1])
