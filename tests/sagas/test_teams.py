"""Teams in the kernel and over REST: spawn, roster, broadcast, inbox, shutdown, budgets, who may
direct a team, and the reconciler's idle timeout. The lead is an external agent played by the test;
teammates are internal agents whose turns no worker runs here (their doorbells wait in Redis)."""

import json
from importlib import import_module
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from accounts.models import User
from agents.tools import Call, execute
from agents.transcripts import Transcript
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.actions import teams as team_actions
from sagas.models import AgentRequest, Broadcast, Collaborator, Run, SteeringItem
from sagas.models import Team as TeamRow
from sagas.tasks import reconcile
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Clock, Team, events_of, profile_named

pytestmark = pytest.mark.usefixtures("fast_passwords", "redis_url")

# The statements finish_run() runs for a run that leads no team at work (PostgreSQL counts only
# those not deferred to ride with a later one).
STATEMENTS_TO_END = {"sqlite": 9, "postgresql": 1}


def spawn(team: Team, name: str, *, by: User | None = None, key: str = "") -> Collaborator:
    mate, _ = actions.spawn_teammate(
        lead=team["lead"], name=name, role="Mate", prompt=f"{name}'s task", profile=profile_named("mate"),
        by=by or team.user("lead"), idempotency_key=key,
    )  # fmt: skip
    return mate


def url(team: Team, rest: str = "") -> str:
    return f"/api/v1/sagas/{team.saga.pk}/teams/agent:lead/{rest}"


def test_a_broadcast_to_50_teammates_is_one_transaction_and_each_gets_exactly_one_item(
    team: Team, settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AGORA_TEAM_MAX_TEAMMATES = 50
    mates = [spawn(team, f"m{i:02}") for i in range(50)]
    lead = team["lead"]
    real_push, pushed = team_actions.push_steering, list[Collaborator]()

    def push_then_fail(**kwargs: Any) -> SteeringItem:
        if len(pushed) == 30:
            raise RuntimeError("the database went away mid-broadcast")
        pushed.append(kwargs["recipient"])
        return real_push(**kwargs)

    monkeypatch.setattr(team_actions, "push_steering", push_then_fail)
    with pytest.raises(RuntimeError):
        actions.broadcast(lead=lead, content="halfway?", by=lead.user)
    # All or nothing: the 30 items written before the failure went with it.
    assert not SteeringItem.objects.filter(broadcast__isnull=False).exists()
    assert not Broadcast.objects.exists() and not events_of(team.saga, "team.broadcast")

    monkeypatch.setattr(team_actions, "push_steering", real_push)
    sent, created = actions.broadcast(lead=lead, content="phase 1 done", by=lead.user, idempotency_key="b1")
    again, replayed = actions.broadcast(lead=lead, content="phase 1 done", by=lead.user, idempotency_key="b1")

    assert created and not replayed and again.pk == sent.pk
    assert sent.recipients == [m.handle for m in mates]
    for mate in mates:
        (item,) = SteeringItem.objects.filter(recipient=mate, broadcast=sent)
        assert (item.kind, item.sender, item.payload) == ("message", "agent:lead", "phase 1 done")
    (event,) = events_of(team.saga, "team.broadcast")
    assert event.data["recipients"] == sent.recipients and event.data["broadcast_id"] == sent.pk
    with pytest.raises(errors.IdempotencyConflict):
        actions.broadcast(lead=lead, content="something else", by=lead.user, idempotency_key="b1")
    # The database holds the line too: a second item of one broadcast for one teammate is refused.
    with pytest.raises(IntegrityError), transaction.atomic():
        SteeringItem.objects.create(recipient=mates[0], seq=999, kind="message", sender="x", broadcast=sent)


def test_a_lead_spawns_reads_its_roster_and_inbox_broadcasts_and_shuts_down_over_rest(team: Team) -> None:
    api = client_for(team.user("lead"), "Bearer")
    body = {"name": "ann", "role": "Researcher", "profile": profile_named("mate"), "prompt": "Survey the clients."}

    first = api.post(url(team, "teammates/"), body, format="json", HTTP_IDEMPOTENCY_KEY="s1")
    replay = api.post(url(team, "teammates/"), body, format="json", HTTP_IDEMPOTENCY_KEY="s1")
    other = api.post(url(team, "teammates/"), {**body, "prompt": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="s1")
    api.post(url(team, "teammates/"), {**body, "name": "ben", "role": ""}, format="json")

    assert (first.status_code, replay.status_code, replay.headers["Idempotent-Replayed"]) == (201, 200, "true")
    assert first.json()["id"] == replay.json()["id"] == "agent:ann" and first.json()["team_status"] == "working"
    problem(other, 409, "idempotency_conflict")
    roster = api.get(url(team)).json()
    assert [(m["id"], m["status"], m["role"]) for m in roster["teammates"]] == [
        ("agent:ann", "working", "Researcher"),
        ("agent:ben", "working", "mate"),
    ]
    assert roster["lead"] == "agent:lead" and roster["tokens_used"] == 0 and roster["max_teammates"] == 8

    sent = api.post(url(team, "broadcasts/"), {"content": "phase 1"}, format="json", HTTP_IDEMPOTENCY_KEY="b1")
    again = api.post(url(team, "broadcasts/"), {"content": "phase 1"}, format="json", HTTP_IDEMPOTENCY_KEY="b1")
    assert (sent.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (201, 200, "true")
    assert sent.json()["recipients"] == ["agent:ann", "agent:ben"] and again.json() == sent.json()
    assert SteeringItem.objects.filter(broadcast_id=sent.json()["broadcast_id"]).count() == 2

    # A teammate writes to its lead: unread in the inbox until the lead acknowledges its steering.
    ask, _ = actions.ask_agent(sender=team["ann"], to="agent:lead", type="team.report", payload={"found": 3})
    inbox = api.get(url(team, "inbox/")).json()
    assert inbox["unread"] == 1
    assert [(i["from"], i["kind"], i["type"], i["read"]) for i in inbox["items"]] == [
        ("agent:ann", "request", "team.report", False)
    ]
    seq = inbox["items"][0]["seq"]
    api.get(f"/api/v1/steering/?after={seq}")  # the feed's cursor acknowledges everything up to seq
    inbox = api.get(url(team, "inbox/")).json()
    assert inbox["unread"] == 0 and inbox["items"][0]["read"] is True

    down = api.post(url(team, "teammates/agent:ann/shutdown/"), {"reason": "Survey done."}, format="json")
    assert down.status_code == 200 and down.json()["status"] == "shutdown"
    ask.refresh_from_db()
    assert ask.status == "cancelled"  # what ann asked and was not answered
    assert [m["status"] for m in api.get(url(team)).json()["teammates"]] == ["shutdown", "working"]
    cards = {c["id"]: c for c in client_for(team.user("lead"), "Bearer").get(
        f"/api/v1/sagas/{team.saga.pk}/collaborators/").json()["collaborators"]}  # fmt: skip
    assert cards["agent:ann"]["team_status"] == "shutdown" and "team_status" not in cards["agent:coder"]
    # Broadcasts after a shutdown reach only those still at work.
    later = api.post(url(team, "broadcasts/"), {"content": "phase 2"}, format="json").json()
    assert later["recipients"] == ["agent:ben"]


def test_a_spawns_idempotency_key_is_its_callers(team: Team, alice: User) -> None:
    """The lead's "s1" and a manager's "s1" are two keys: each replays only its own spawn."""
    body = {"role": "Researcher", "profile": profile_named("mate"), "prompt": "Survey the clients."}
    lead, manager = client_for(team.user("lead"), "Bearer"), client_for(alice)
    ann = lead.post(url(team, "teammates/"), {**body, "name": "ann"}, format="json", HTTP_IDEMPOTENCY_KEY="s1")
    carl = manager.post(url(team, "teammates/"), {**body, "name": "carl"}, format="json", HTTP_IDEMPOTENCY_KEY="s1")
    again = manager.post(url(team, "teammates/"), {**body, "name": "carl"}, format="json", HTTP_IDEMPOTENCY_KEY="s1")
    assert (ann.status_code, carl.status_code, again.status_code) == (201, 201, 200)
    assert (ann.json()["id"], carl.json()["id"], again.json()["id"]) == ("agent:ann", "agent:carl", "agent:carl")


def test_only_the_lead_or_a_manager_directs_a_team(team: Team, alice: User, bob: User, mallory: User) -> None:
    spawn(team, "ann")
    ann = team["ann"]
    broadcast, shutdown = url(team, "broadcasts/"), url(team, "teammates/agent:ann/shutdown/")
    for user in (bob, team.user("scout"), team.user("ann")):  # a person, a sibling agent, the teammate itself
        scheme = "Bearer" if user.is_agent else "Token"
        problem(client_for(user, scheme).post(broadcast, {"content": "hi"}, format="json"), 403, "not_team_lead")
        problem(client_for(user, scheme).post(shutdown, {}, format="json"), 403, "not_team_lead")
    problem(client_for(mallory).post(broadcast, {"content": "hi"}, format="json"), 404, "not_found")
    problem(client_for(bob).get(url(team)), 404, "not_found")  # the roster is for the team and managers
    assert client_for(team.user("ann"), "Bearer").get(url(team)).status_code == 200
    spawn_body = {"name": "eve", "profile": profile_named("mate"), "prompt": "p"}
    problem(client_for(team.user("scout"), "Bearer").post(url(team, "teammates/"), spawn_body, format="json"),
            403, "not_team_lead")  # fmt: skip
    with pytest.raises(errors.NotTeamLead):
        actions.shutdown_teammate(teammate=ann, reason="no", by=team.user("coder"))
    assert not SteeringItem.objects.filter(recipient=ann, broadcast__isnull=False).exists()
    assert Run.objects.get(collaborator=ann).status == Run.Status.QUEUED

    assert client_for(alice).post(broadcast, {"content": "from the owner"}, format="json").status_code == 201
    assert client_for(alice).post(shutdown, {}, format="json").json()["status"] == "shutdown"
    event = JournalEvent.objects.for_saga(team.saga.pk).get(type="run.shutdown")
    assert event.actor == "human:alice"


def test_spawning_past_the_teams_budget_is_refused_with_a_stable_code(team: Team, settings: LazySettings) -> None:
    settings.AGORA_TEAM_MAX_TEAMMATES = 2
    spawn(team, "ann")
    spawn(team, "ben")
    api = client_for(team.user("lead"), "Bearer")
    body = {"name": "cy", "profile": profile_named("mate"), "prompt": "p"}

    refused = problem(api.post(url(team, "teammates/"), body, format="json"), 409, "team_full")

    assert "cap 2" in refused["detail"] and not Collaborator.objects.filter(name="cy").exists()
    actions.shutdown_teammate(teammate=team["ann"], reason="make room", by=team.user("lead"))
    assert api.post(url(team, "teammates/"), body, format="json").status_code == 201


def test_a_teams_tokens_are_counted_by_its_teammates_turns_and_the_migration_counts_earlier_ones(
    team: Team, settings: LazySettings
) -> None:
    ann, ben = spawn(team, "ann"), spawn(team, "ben")
    outsider, _ = actions.add_agent(
        saga=team.saga, name="solo", role="Solo", task="t", runtime="internal", profile=profile_named("mate"),
        by=team.user("lead"),
    )  # fmt: skip
    lead_team = actions.team_of(team.saga, "agent:lead")
    for run_id, calls in ((ann.run.pk, [7, 11]), (ben.run.pk, [5]), (outsider.run.pk, [1000])):
        transcript = Transcript(run_id)
        for tokens in calls:  # a turn's model calls, each with what it used
            transcript.append(1, [{"role": "assistant", "content": "x"}], tokens=tokens)
        with transaction.atomic():  # as a teammate's turn stores its transcript (agents.executor)
            saved = transcript.save()
            if run_id != outsider.run.pk:
                actions.count_team_tokens(team_id=lead_team.pk, tokens=saved)
    lead_team.refresh_from_db()
    assert lead_team.tokens_used == 23  # the outsider's tokens are not the team's

    # A team whose history predates the count: the migration adds up what the transcripts hold.
    type(lead_team).objects.filter(pk=lead_team.pk).update(tokens_used=0)
    with connection.cursor() as cursor:
        cursor.execute(import_module("agents.migrations.0008_team_tokens_counted").COUNT)
    lead_team.refresh_from_db()
    assert lead_team.tokens_used == 23

    # The budget is read from that total: at it, no one more joins.
    type(lead_team).objects.filter(pk=lead_team.pk).update(max_tokens=23)
    with pytest.raises(errors.TeamBudgetExhausted, match="used 23 of its 23 tokens"):
        spawn(team, "cy")


def test_the_reconciler_shuts_down_a_teammate_idle_past_its_teams_timeout(
    team: Team, clock: Clock, settings: LazySettings
) -> None:
    settings.AGORA_TEAM_IDLE_TIMEOUT_S = 600
    ann, ben = spawn(team, "ann"), spawn(team, "ben")
    for mate in (ann, ben):  # each plays a first turn that finds nothing more to do
        run = actions.claim_turn(run_id=mate.run.pk)
        assert run is not None
        with actions.saga_transaction(team.saga):
            actions.end_turn(run=run, turn=run.turn, more=False)
    assert Run.objects.get(collaborator=ann).status == Run.Status.IDLE
    clock.advance(300)
    actions.steer(saga=team.saga, to=ben, message="keep going", by=team.saga.owner)  # ben is woken, not idle

    clock.advance(301)
    counts = reconcile()

    assert counts["teammates_shut_down"] == 1
    ann_run = Run.objects.get(collaborator=ann)
    assert ann_run.status == Run.Status.SHUTDOWN and "Idle for more than 600 s" in ann_run.error
    assert Run.objects.get(collaborator=ben).status == Run.Status.QUEUED
    (event,) = events_of(team.saga, "run.shutdown")
    assert event.actor == "system" and event.run_id == ann_run.pk
    assert reconcile()["teammates_shut_down"] == 0


def test_shutting_a_team_down_ends_every_teammate_at_work(team: Team) -> None:
    spawn(team, "ann")
    spawn(team, "ben")
    assert actions.shutdown_team(team=actions.team_of(team.saga, "agent:lead"), reason="saga finished") == 2
    assert set(Run.objects.filter(team__isnull=False).values_list("status", flat=True)) == {"shutdown"}
    assert json.dumps([e.data for e in events_of(team.saga, "run.shutdown")]).count("saga finished") == 2


def test_the_saga_page_and_its_live_part_show_the_roster_and_the_lead_inbox(team: Team, alice: User, bob: User) -> None:
    from django.test import Client

    browser, watcher = Client(), Client()
    browser.force_login(alice)
    watcher.force_login(bob)  # in the saga, not one of its managers
    page_url = f"/sagas/{team.saga.pk}/"
    assert "No team yet." in browser.get(page_url).content.decode()
    spawn(team, "ann")
    spawn(team, "ben")
    actions.ask_agent(sender=team["ben"], to="agent:lead", type="team.report", payload={"found": "three clients"})
    actions.shutdown_teammate(teammate=team["ann"], reason="done", by=alice)

    for html in (browser.get(page_url).content.decode(), browser.get(f"{page_url}live/teams/").content.decode()):
        assert 'data-team="agent:lead"' in html
        assert 'data-teammate="agent:ann" data-status="shutdown"' in html
        assert 'data-teammate="agent:ben" data-status="working"' in html
        assert 'data-unread="1"' in html and "team.report" in html and "three clients" in html
    # The roster is the collaborators bob sees on the page anyway; the inbox holds requests, which he
    # sees only as a party to them (as over REST and in the journal).
    for html in (watcher.get(page_url).content.decode(), watcher.get(f"{page_url}live/teams/").content.decode()):
        assert 'data-teammate="agent:ben" data-status="working"' in html
        assert "three clients" not in html and "data-unread" not in html
        assert "The lead's inbox is for the saga's managers." in html


def test_a_manager_sets_a_teams_budgets_and_its_lead_cannot(team: Team, alice: User) -> None:
    lead_api, owner_api = client_for(team.user("lead"), "Bearer"), client_for(alice)

    problem(lead_api.patch(url(team), {"max_teammates": 99}, format="json"), 403, "forbidden")
    problem(owner_api.patch(url(team), {"max_tokens": -1}, format="json"), 400, "invalid_payload")
    # Past what a column holds, or an idle timeout whose deadline no date holds (the reconciler
    # computes it for every idle teammate): refused, not a 500 or a reconciler that fails each pass.
    for budget in ({"max_tokens": 2**63}, {"max_teammates": 2**31}, {"idle_timeout_s": 1e12}):
        problem(owner_api.patch(url(team), budget, format="json"), 400, "invalid_payload")
        with pytest.raises(errors.InvalidPayload):
            actions.configure_team(lead=team["lead"], by=alice, **budget)
    assert not events_of(team.saga, "team.configured")
    configured = owner_api.patch(url(team), {"max_teammates": 1, "idle_timeout_s": 0}, format="json")

    assert configured.status_code == 200
    assert (configured.json()["max_teammates"], configured.json()["idle_timeout_s"]) == (1, 0)
    (event,) = events_of(team.saga, "team.configured")
    assert event.actor == "human:alice" and event.data["max_teammates"] == 1
    spawn(team, "ann")
    with pytest.raises(errors.TeamFull):
        spawn(team, "ben")


def test_team_events_read_well_in_the_timeline(team: Team) -> None:
    from sagas.dashboard import describe

    spawn(team, "ann")
    actions.broadcast(lead=team["lead"], content="phase 1 done", by=team.user("lead"))
    lines = [describe(e) for e in JournalEvent.objects.for_saga(team.saga.pk).filter(type__startswith="team.")]
    assert lines == ["spawned teammate agent:ann (Mate) for agent:lead", "broadcast to 1 teammates: phase 1 done"]


def test_a_teammate_leads_no_team_of_its_own(team: Team, alice: User) -> None:
    """Teams do not nest: a teammate's own team would hold neither its lead's cap on teammates nor
    its budget of tokens."""
    actions.configure_team(lead=team["lead"], by=alice, max_teammates=1)
    ann = spawn(team, "ann")

    for by in (ann.user, alice):  # the teammate itself, or a manager on its behalf
        with pytest.raises(errors.NotTeamLead, match="teammates lead none"):
            actions.spawn_teammate(lead=ann, name="sub", role="Sub", prompt="p", profile=profile_named("mate"), by=by)
    assert not Collaborator.objects.filter(saga=team.saga, name="sub").exists()
    assert not TeamRow.objects.filter(lead=ann).exists()


def test_a_teammate_delegates_no_agent(team: Team, alice: User) -> None:
    """A teammate's delegate would work outside its team's budget of tokens: its `delegate` tool is
    refused, as spawning is, and the kernel adds no agent under it for anyone; its lead delegates
    as before."""
    ann = spawn(team, "ann")
    sub = json.dumps({"name": "sub", "role": "Sub", "task": "t", "profile": profile_named("mate")})

    refused = execute(Call(run=Run.objects.get(collaborator=ann), collaborator=ann, turn=1, call_id="c1"),
                      "delegate", sub, ["delegate"]).result or {}  # fmt: skip

    assert refused["error"]["code"] == "not_team_lead" and "teammates lead none" in refused["error"]["message"]
    assert not Collaborator.objects.filter(saga=team.saga, name="sub").exists()
    # Nor does a manager add one under it, or the teammate itself over the API: the kernel refuses.
    under = {"kind": "agent", "name": "sub", "runtime": "external", "parent": "agent:ann"}
    path = f"/api/v1/sagas/{team.saga.pk}/collaborators/"
    problem(client_for(alice).post(path, under, format="json"), 403, "not_team_lead")
    assert not Collaborator.objects.filter(saga=team.saga, name="sub").exists()
    lead = Call(run=team.run("lead"), collaborator=team["lead"], turn=1, call_id="c2")
    assert (execute(lead, "delegate", sub, ["delegate"]).result or {}).get("id") == "agent:sub"


def test_a_lead_that_finishes_takes_its_team_down_with_it(team: Team) -> None:
    """In the transaction that ends the lead, each of its teammates at work is shut down as the
    lead's own shutdown of it would: journaled, what it was asked fails, what it asked is
    cancelled. Another lead's teammates and the agents in no team go on."""
    ann, ben, gone = spawn(team, "ann"), spawn(team, "ben"), spawn(team, "gone")
    actions.shutdown_teammate(teammate=gone, reason="Not needed.", by=team.user("lead"))
    cy, _ = actions.spawn_teammate(
        lead=team["coder"], name="cy", role="Mate", prompt="p", profile=profile_named("mate"), by=team.user("coder")
    )
    run = actions.claim_turn(run_id=ben.run.pk)  # ben plays its first turn and idles; ann has not started
    assert run is not None
    with actions.saga_transaction(team.saga):
        actions.end_turn(run=run, turn=run.turn, more=False)
    assert team.run("ben").status == Run.Status.IDLE
    asked, _ = actions.ask_agent(sender=team["reviewer"], to="agent:ann", type="review", payload={})
    asking, _ = actions.ask_agent(sender=ann, to="agent:coder", type="need.data", payload={})
    others = {name: team.run(name).status for name in ("scout", "coder", "reviewer", "tester", "cy")}

    finished = client_for(team.user("lead"), "Bearer").post(
        f"/api/v1/runs/{team.run('lead').pk}/status/", {"status": "finished"}, format="json"
    )

    assert finished.status_code == 200 and finished.json()["status"] == "completed"
    why = "The team's lead agent:lead ended (completed)."
    for mate in (ann, ben):
        run = Run.objects.get(collaborator=mate)
        assert (run.status, run.error, run.resumable) == (Run.Status.SHUTDOWN, why, False)
    assert (team.run("gone").status, team.run("gone").error) == (Run.Status.SHUTDOWN, "Not needed.")
    assert {name: team.run(name).status for name in others} == others
    assert Run.objects.get(collaborator=cy).status == Run.Status.QUEUED
    events = JournalEvent.objects.for_saga(team.saga.pk).filter(type__in=["run.completed", "run.shutdown"])
    ended = [(e.type, e.actor, e.run_id, e.data["error"]) for e in events if e.run_id != gone.run.pk]
    assert ended == [
        ("run.completed", "agent:lead", team.run("lead").pk, ""),
        ("run.shutdown", "agent:lead", ann.run.pk, why),
        ("run.shutdown", "agent:lead", ben.run.pk, why),
    ]
    asked.refresh_from_db()
    asking.refresh_from_db()
    assert (asked.status, asking.status) == (AgentRequest.Status.RECIPIENT_UNAVAILABLE, AgentRequest.Status.CANCELLED)
    roster = {m["id"]: m for m in client_for(team.user("lead"), "Bearer").get(url(team)).json()["teammates"]}
    assert (roster["agent:ann"]["status"], roster["agent:ann"]["reason"]) == ("shutdown", why)
    with pytest.raises(errors.RecipientUnavailable):  # and it never wakes again
        actions.ask_agent(sender=team["reviewer"], to="agent:ann", type="more", payload={})


def test_a_run_that_leads_no_team_ends_in_as_many_statements_as_before(team: Team) -> None:
    """Every run's end asks whether it leads a team with anyone at work, in the statement that
    ends it: the runs that lead none (most) pay nothing more for it, nor does a lead whose
    teammates have all ended."""
    ann = spawn(team, "ann")
    actions.shutdown_teammate(teammate=ann, reason="Done.", by=team.user("lead"))
    counts = []
    for name in ("scout", "lead"):
        run = Run.objects.select_related("collaborator").get(pk=team.run(name).pk)
        with CaptureQueriesContext(connection) as queries, actions.saga_transaction(team.saga, current=True):
            assert actions.finish_run(run=run, status=Run.Status.COMPLETED, result={"ok": True})
        counts.append(len(queries.captured_queries))
    assert counts == [STATEMENTS_TO_END[connection.vendor]] * 2
