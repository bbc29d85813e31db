"""A saga's end through a real Celery worker: finishing it over REST shuts its teams down and ends
everything still at work in it, then refuses new work; and a team that runs out of tokens mid-work
stops its teammates before their next model call."""

from typing import Any

from accounts.models import User
from agents.actions import load_profiles
from journal.models import JournalEvent
from sagas import actions
from sagas.models import AgentRequest, Broadcast, Collaborator, HumanRequest, Run, Saga, SteeringItem
from sagas.tasks import reconcile
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import events_of
from tests.support import CeleryWorker, wait_until


def run_of(collaborator: Collaborator) -> Run:
    return Run.objects.get(collaborator=collaborator)


def counts(saga: Saga) -> dict[str, int]:
    """What a refused call must not have added to."""
    return {
        "events": JournalEvent.objects.filter(saga=saga).count(),
        "collaborators": Collaborator.objects.filter(saga=saga).count(),
        "requests": AgentRequest.objects.filter(saga=saga).count(),
        "forms": HumanRequest.objects.filter(saga=saga).count(),
        "steering": SteeringItem.objects.filter(recipient__saga=saga).count(),
        "broadcasts": Broadcast.objects.filter(team__saga=saga).count(),
    }


def test_a_saga_finished_over_rest_shuts_its_teams_down_ends_its_work_and_takes_no_more(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User, bob: User
) -> None:
    load_profiles(entries=[
        {"name": "waiter", "role": "Mate", "model": "waiter", "tools": ["ask_agent", "finish"]},
        {"name": "idler", "role": "Mate", "model": "idler", "tools": ["finish"]},
        {"name": "solo", "role": "Solo", "model": "solo", "tools": ["finish"]},
    ])  # fmt: skip
    wait_for_lead = {"to": "agent:lead", "type": "need.data", "payload": {}, "mode": "wait", "timeout_s": 300}
    fake_llm.script("waiter", say("", tool_call("ask_agent", wait_for_lead)))
    for model in ("waiter", "idler", "solo"):
        fake_llm.rule(model, lambda body: say("Nothing more for now."))
    actions.add_human(saga=saga, user=bob, role="Analyst", task="Read", by=alice)
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="Lead", runtime="external", by=alice)
    solo, _ = actions.add_agent(
        saga=saga, name="solo", role="Solo", task="t", runtime="internal", profile="solo", by=alice
    )
    waiter, _ = actions.spawn_teammate(
        lead=lead, name="waiter", role="Mate", prompt="p", profile="waiter", by=lead.user
    )
    idler, _ = actions.spawn_teammate(lead=lead, name="idler", role="Mate", prompt="p", profile="idler", by=lead.user)
    wait_until(lambda: run_of(waiter).status == Run.Status.WAITING, what="the waiter to wait on its lead")
    wait_until(lambda: run_of(idler).status == run_of(solo).status == Run.Status.IDLE, what="the others to idle")
    outbound = AgentRequest.objects.get(sender=waiter)
    # The waiter is parked: what its lead asks it stays pending in its steering.
    inbound, _ = actions.ask_agent(sender=lead, to="agent:waiter", type="slow.task", payload={"n": 1})
    form, _ = actions.ask_human(asker=lead, title="OK?", fields=[{"name": "ok", "type": "boolean"}])
    idler_calls = len(fake_llm.calls_for("idler"))

    owner, lead_api = client_for(alice), client_for(lead.user, "Bearer")
    url = f"/api/v1/sagas/{saga.pk}/finish/"
    untouched = counts(saga)
    problem(client_for(bob).post(url, {"status": "cancelled"}, format="json"), 403, "forbidden")
    problem(lead_api.post(url, {"status": "cancelled"}, format="json"), 403, "forbidden")
    assert counts(saga) == untouched and Saga.objects.get(pk=saga.pk).status == Saga.Status.OPEN
    assert run_of(idler).status == Run.Status.IDLE
    assert AgentRequest.objects.get(pk=inbound.pk).status == AgentRequest.Status.PENDING

    response = owner.post(url, {"status": "completed", "reason": "Shipped"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "completed" and response.json()["id"] == str(saga.pk)
    saga.refresh_from_db()
    assert saga.status == Saga.Status.COMPLETED
    (finished,) = events_of(saga, "saga.finished")
    assert finished.actor == "human:alice"
    assert finished.data == {"status": "completed", "reason": "Shipped", "by": "human:alice"}
    roster = {m.id: m for m in actions.roster(actions.team_of(saga, "agent:lead"))}
    assert {m.status for m in roster.values()} == {"shutdown"}
    assert roster["agent:idler"].reason == "The saga was completed: Shipped"
    inbound.refresh_from_db()
    outbound.refresh_from_db()
    form.refresh_from_db()
    assert inbound.status == AgentRequest.Status.RECIPIENT_UNAVAILABLE
    assert outbound.status == AgentRequest.Status.CANCELLED
    assert form.status == HumanRequest.Status.CANCELLED
    assert run_of(solo).status == run_of(lead).status == Run.Status.CANCELLED
    assert not AgentRequest.objects.filter(saga=saga, status__in=AgentRequest.OPEN).exists()

    # New work is refused with one code, and nothing is written.
    before = counts(saga)
    refused = [
        lead_api.post(f"/api/v1/sagas/{saga.pk}/requests/", {"to": "agent:idler", "type": "t", "payload": {}},
                      format="json"),
        lead_api.post(f"/api/v1/sagas/{saga.pk}/human-requests/",
                      {"title": "More?", "fields": [{"name": "n", "type": "text"}]}, format="json"),
        lead_api.post(f"/api/v1/sagas/{saga.pk}/teams/agent:lead/teammates/",
                      {"name": "late", "profile": "idler", "prompt": "p"}, format="json"),
        lead_api.post(f"/api/v1/sagas/{saga.pk}/teams/agent:lead/broadcasts/", {"content": "wake up"}, format="json"),
        owner.post(f"/api/v1/sagas/{saga.pk}/collaborators/",
                   {"kind": "agent", "name": "late", "role": "R", "task": "t", "runtime": "external"}, format="json"),
        owner.post(f"/api/v1/sagas/{saga.pk}/collaborators/agent:idler/steer/", {"message": "wake up"},
                   format="json"),
        owner.post(f"/api/v1/sagas/{saga.pk}/prompts/", {"prompt": "One more thing"}, format="json"),
    ]  # fmt: skip
    for answer in refused:
        assert problem(answer, 409, "saga_finished")["saga_status"] == "completed"
    assert counts(saga) == before

    # Finishing again: the same status changes nothing; the other one is refused.
    again = owner.post(url, {"status": "completed"}, format="json")
    assert again.status_code == 200 and again.json()["status"] == "completed"
    problem(owner.post(url, {"status": "cancelled"}, format="json"), 409, "saga_finished")
    assert counts(saga) == before and len(events_of(saga, "saga.finished")) == 1

    # Nothing wakes a teammate of a finished saga, and everything stays readable.
    reconcile()
    assert run_of(idler).status == Run.Status.SHUTDOWN and len(fake_llm.calls_for("idler")) == idler_calls
    for path in ("", "journal/", "teams/agent:lead/", "collaborators/"):
        assert owner.get(f"/api/v1/sagas/{saga.pk}/{path}").status_code == 200, path
    assert lead_api.get(f"/api/v1/requests/{inbound.pk}/").json()["status"] == "recipient_unavailable"


def test_a_team_that_runs_out_of_tokens_mid_work_stops_its_teammates_before_their_next_model_call(
    worker: CeleryWorker, fake_llm: FakeLLM, saga: Saga, alice: User
) -> None:
    load_profiles(entries=[{"name": "eater", "role": "Mate", "model": "eater", "tools": ["finish"]}])
    fake_llm.rule("eater", lambda body: say("Done, waiting."))
    lead, _ = actions.add_agent(saga=saga, name="lead", role="Lead", task="Lead", runtime="external", by=alice)
    team = actions.configure_team(lead=lead, by=alice, max_tokens=30)  # the fake model spends 18 a call
    first, _ = actions.spawn_teammate(lead=lead, name="first", role="Mate", prompt="p", profile="eater", by=alice)
    wait_until(lambda: run_of(first).status == Run.Status.IDLE, what="the first teammate to idle")
    # 18 of 30 used: a second teammate may still join, and its first turn takes the team past its budget.
    second, _ = actions.spawn_teammate(lead=lead, name="second", role="Mate", prompt="p", profile="eater", by=alice)
    wait_until(lambda: run_of(second).status == Run.Status.IDLE, what="the second teammate to idle")
    used = sum(m.tokens for m in actions.roster(team))
    assert used >= team.max_tokens and len(fake_llm.calls_for("eater")) == 2
    team.refresh_from_db()
    assert team.tokens_used == used  # the total the turns counted is what their transcripts hold

    sent, _ = actions.broadcast(lead=lead, content="Next task.", by=lead.user)

    def both_stopped() -> bool:
        return {run_of(first).status, run_of(second).status} == {Run.Status.SHUTDOWN}

    wait_until(both_stopped, timeout=30, what="both teammates to be shut down")
    assert sent.recipients == ["agent:first", "agent:second"]
    assert len(fake_llm.calls_for("eater")) == 2  # neither woken turn called the model
    stops = events_of(saga, "run.shutdown")
    assert sorted(e.run_id for e in stops) == sorted([run_of(first).pk, run_of(second).pk])
    for event in stops:
        assert event.actor == "system"
        assert event.data["error"] == f"team_budget_exhausted: the team used {used} of its 30 tokens."
    roster: dict[str, Any] = {m.id: m for m in actions.roster(team)}
    for handle in ("agent:first", "agent:second"):
        assert roster[handle].status == "shutdown" and roster[handle].reason.startswith("team_budget_exhausted")
    # What woke them is still unread: nothing of the turn that was refused was kept.
    assert SteeringItem.objects.filter(broadcast=sent, consumed_at__isnull=True).count() == 2
