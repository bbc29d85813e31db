"""One visibility rule for the journal (`sagas.access.JournalLens`), checked through every reader:
the journal API, the JSONL export, the WebSocket and the dashboard's timeline and parts.

The story, under `hub`: coder's sibling reviewer asks lead for a review with a secret payload and
lead replies; lead sends a form to alice; coder asks lead for a plan. Coder sees its lineage and
the people, so it must see its own request, lead's and tester's joins, and nothing of reviewer,
of the review or of lead's form. Bob, a person who is not a manager, sees every join but only the
requests and forms he is party to (none here). Alice owns the saga and sees everything.
"""

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from accounts.actions import issue_token
from accounts.models import User
from config.asgi import application
from journal.actions import record
from journal.models import JournalEvent
from sagas.access import JournalLens
from sagas.actions import (
    add_agent,
    answer_human_request,
    ask_agent,
    ask_human,
    broadcast,
    consume_steering,
    reply_to_request,
    revoke_agent_token,
    rotate_agent_token,
    set_exposed,
    spawn_teammate,
)
from sagas.models import Saga
from tests.journal.test_consumer import ORIGIN, TIMEOUT
from tests.sagas.api_http import client_for
from tests.sagas.conftest import build_team
from tests.sagas.kernel import Team, profile_named

SECRETS = ("agent:reviewer", "review-secret", "reply-secret", "Budget sign-off", "hreq-")


def tell(team: Team, alice: User) -> None:
    # reviewer at work, as the runtime journals it: a worker of a collaborator coder does not see.
    record(saga_id=team.saga.pk, type="worker_start", actor="agent:reviewer", run_id=team.run("reviewer").pk,
           data={"role": "Reviewer", "task": "reviewer-at-work"})  # fmt: skip
    review, _ = ask_agent(sender=team["reviewer"], to="agent:lead", type="review", payload={"s": "review-secret"})
    with transaction.atomic():
        consume_steering(recipient=team["lead"])
    reply_to_request(request_id=review.pk, by=team.user("lead"), payload={"s": "reply-secret"})
    form, _ = ask_human(
        asker=team["lead"], title="Budget sign-off", fields=[{"name": "ok", "type": "boolean"}], to="human:alice"
    )
    answer_human_request(human_request_id=form.pk, answer={"ok": True}, by=alice)
    ask_agent(sender=team["coder"], to="agent:lead", type="plan", payload={"s": "coder-own"})


def hub_story(alice: User, bob: User, policy: str = Saga.Policy.HUB) -> Team:
    team = build_team(owner=alice, policy=policy, humans=[bob])
    tell(team, alice)
    return team


@pytest.fixture
def story(alice: User, bob: User) -> Team:
    return hub_story(alice, bob)


def check_coder_sees_its_part(events: list[dict[str, Any]]) -> None:
    """What coder must and must not see of the story."""
    text = json.dumps(events)
    assert not [secret for secret in SECRETS if secret in text], text
    joined = {e["data"]["id"] for e in events if e["type"] == "collaborator.joined"}
    assert joined == {"human:alice", "human:bob", "agent:lead", "agent:coder", "agent:tester"}
    assert [e["data"]["payload"] for e in events if e["type"] == "request.created"] == [{"s": "coder-own"}]
    assert not [e for e in events if e["type"].startswith("human_request.")]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)


def check_bob_sees_joins_but_no_one_elses_requests(events: list[dict[str, Any]]) -> None:
    text = json.dumps(events)
    assert "agent:reviewer" in {e["data"].get("id") for e in events}  # people see everyone
    for secret in ("review-secret", "reply-secret", "coder-own", "Budget sign-off"):
        assert secret not in text
    assert not [e for e in events if e["type"].startswith(("request.", "human_request."))]


def all_events(saga: Saga) -> list[dict[str, Any]]:
    return [e.as_dict() for e in JournalEvent.objects.for_saga(saga.pk)]


# --- the rule itself -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
@pytest.mark.parametrize("policy", [Saga.Policy.HUB, Saga.Policy.TREE, Saga.Policy.OPEN])
def test_the_rule_per_policy(alice: User, bob: User, policy: str) -> None:
    team = hub_story(alice, bob, policy)
    everything = all_events(team.saga)

    def seen(user: User) -> list[dict[str, Any]]:
        return JournalLens(user, team.saga).visible(everything)

    assert seen(alice) == everything
    coder = seen(team.user("coder"))
    # A sibling's join is seen where siblings see each other; its requests are not, under any policy.
    assert ("agent:reviewer" in {e["data"].get("id") for e in coder}) is (policy != Saga.Policy.HUB)
    assert "review-secret" not in json.dumps(coder) and "Budget sign-off" not in json.dumps(coder)
    # lead is party to the review and asked the form: it sees both.
    lead_text = json.dumps(seen(team.user("lead")))
    assert all(s in lead_text for s in ("review-secret", "reply-secret", "Budget sign-off", "coder-own"))
    # scout, under alice beside lead, sees nothing of lead's requests, and lead's join only off hub.
    scout = seen(team.user("scout"))
    assert "review-secret" not in json.dumps(scout)
    assert ("agent:lead" in {e["data"].get("id") for e in scout}) is (policy != Saga.Policy.HUB)
    check_bob_sees_joins_but_no_one_elses_requests(seen(bob))


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_a_lens_meets_collaborators_who_join_after_it(alice: User, bob: User) -> None:
    team = build_team(owner=alice, policy=Saga.Policy.HUB, humans=[bob], tree=[("lead", None), ("coder", "lead")])
    lens = JournalLens(team.user("coder"), team.saga)  # built before reviewer and tester exist
    for name, parent in (("reviewer", "lead"), ("tester", "coder")):
        add_agent(saga=team.saga, name=name, role=name, task="t", runtime="external", profile="",
                  parent=f"agent:{parent}", by=alice)  # fmt: skip
    joined = {e["data"]["id"] for e in lens.visible(all_events(team.saga)) if e["type"] == "collaborator.joined"}

    assert "agent:tester" in joined and "agent:reviewer" not in joined


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_a_managers_event_about_a_collaborator_is_seen_only_by_who_sees_it(alice: User, bob: User) -> None:
    """Exposing an agent, rotating or revoking its token: the actor is a manager, whom everyone
    sees; the event names the agent (`id`), which a hub delegate's sibling must not learn of."""
    team = build_team(owner=alice, policy=Saga.Policy.HUB, humans=[bob])
    set_exposed(saga=team.saga, handle="agent:reviewer", exposed=True, by=alice)
    rotate_agent_token(saga=team.saga, handle="agent:reviewer", by=alice)
    revoke_agent_token(saga=team.saga, handle="agent:reviewer", by=alice)
    everything = all_events(team.saga)
    about = ["collaborator.exposed", "collaborator.token_rotated", "collaborator.token_revoked"]

    def seen(user: User) -> list[str]:
        return [e["type"] for e in JournalLens(user, team.saga).visible(everything) if e["type"] in about]

    assert seen(team.user("coder")) == []  # reviewer is its sibling under hub
    assert seen(team.user("lead")) == seen(bob) == about  # its delegator; a person sees everyone


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_a_teams_events_are_seen_by_who_sees_its_teammates_and_its_broadcast_by_its_parties(
    alice: User, bob: User
) -> None:
    """Under `tree` scout sees its sibling lead but not lead's delegates: not a teammate lead
    spawns (`team.spawned` names it), nor what lead broadcasts to its teammates."""
    team = build_team(owner=alice, policy=Saga.Policy.TREE, humans=[bob])
    lead = team["lead"]
    spawn_teammate(lead=lead, name="mate", role="Mate", prompt="p", profile=profile_named("mate"), by=lead.user)
    broadcast(lead=lead, content={"brief": "for-teammates-only"}, by=lead.user)
    everything = all_events(team.saga)

    def seen(user: User) -> str:
        visible = JournalLens(user, team.saga).visible(everything)
        return json.dumps([e for e in visible if e["type"].startswith("team.")])

    assert "agent:mate" not in seen(team.user("scout")) and "for-teammates-only" not in seen(team.user("scout"))
    assert "for-teammates-only" not in seen(bob)  # a person sees the spawn, not a broadcast he is not party to
    assert "agent:mate" in seen(bob)
    for party in ("lead", "mate"):
        assert "for-teammates-only" in seen(team.user(party))


# --- every reader ----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_the_journal_api_applies_the_rule(story: Team, alice: User, bob: User) -> None:
    url = f"/api/v1/sagas/{story.saga.pk}/journal/"

    check_coder_sees_its_part(client_for(story.user("coder"), "Bearer").get(url).json()["events"])
    check_bob_sees_joins_but_no_one_elses_requests(client_for(bob).get(url).json()["events"])
    assert client_for(alice).get(url).json()["events"] == all_events(story.saga)
    # A page counts visible events only, and the next page starts after the last one seen.
    coder = client_for(story.user("coder"), "Bearer")
    first = coder.get(f"{url}?limit=2").json()["events"]
    rest = coder.get(f"{url}?after={first[-1]['seq']}").json()["events"]
    check_coder_sees_its_part(first + rest)


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_the_export_applies_the_rule(story: Team, alice: User, bob: User) -> None:
    url = f"/api/v1/sagas/{story.saga.pk}/journal.jsonl"

    def lines(user: User, scheme: str = "Token") -> list[dict[str, Any]]:
        response = client_for(user, scheme).get(url)
        assert response.status_code == 200
        return [json.loads(line) for line in response.getvalue().decode().splitlines()]

    check_coder_sees_its_part(lines(story.user("coder"), "Bearer"))
    check_bob_sees_joins_but_no_one_elses_requests(lines(bob))
    assert lines(alice) == all_events(story.saga)


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords")
def test_the_dashboard_timeline_and_parts_apply_the_rule(story: Team, bob: User) -> None:
    for user in (story.user("coder"), bob):
        browser = Client()
        browser.force_login(user)
        pages = [
            browser.get(f"/sagas/{story.saga.pk}/"),
            browser.get(f"/sagas/{story.saga.pk}/journal/?after=0"),
            browser.get(f"/sagas/{story.saga.pk}/journal/?before=100000"),
            *(browser.get(f"/sagas/{story.saga.pk}/live/{part}/") for part in ("requests", "workers", "inbox")),
        ]
        for page in pages:
            assert page.status_code == 200
            text = page.content.decode()
            for secret in ("review-secret", "reply-secret", "Budget sign-off", "/admin/"):
                assert secret not in text, (user.username, page.request["PATH_INFO"], secret)
    coder = Client()
    coder.force_login(story.user("coder"))
    rows = coder.get(f"/sagas/{story.saga.pk}/journal/?after=0").content.decode()
    assert "asked agent:lead · plan" in rows  # its own request is there
    assert "added agent:reviewer" not in rows
    assert "reviewer-at-work" not in coder.get(f"/sagas/{story.saga.pk}/live/workers/").content.decode()
    bob_sees = Client()
    bob_sees.force_login(bob)
    assert "reviewer-at-work" in bob_sees.get(f"/sagas/{story.saga.pk}/live/workers/").content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_passwords")
async def test_the_websocket_applies_the_rule_to_the_replay_and_to_live_events(alice: User, bob: User) -> None:
    team = await database_sync_to_async(hub_story)(alice, bob)
    coder_user = await database_sync_to_async(team.user)("coder")
    token = await database_sync_to_async(issue_token)(user=coder_user)
    headers = [ORIGIN, (b"authorization", f"Bearer {token}".encode())]
    socket = WebsocketCommunicator(application, f"/ws/sagas/{team.saga.pk}/journal/?after=0", headers=headers)
    connected, _ = await socket.connect(timeout=TIMEOUT)
    try:
        assert connected

        def live() -> None:  # hidden from coder, then its own sentinel
            ask_agent(sender=team["reviewer"], to="agent:lead", type="review", payload={"s": "review-secret"})
            ask_agent(sender=team["coder"], to="agent:lead", type="sentinel", payload={"s": "coder-own"})

        await database_sync_to_async(live)()
        events: list[dict[str, Any]] = []
        while not events or events[-1]["data"].get("type") != "sentinel":
            message = await socket.receive_json_from(timeout=TIMEOUT)
            events.append(message["event"])
    finally:
        await socket.disconnect()
    assert [e["data"]["type"] for e in events if e["type"] == "request.created"] == ["plan", "sentinel"]
    check_coder_sees_its_part([e for e in events if e["data"].get("type") != "sentinel"])
