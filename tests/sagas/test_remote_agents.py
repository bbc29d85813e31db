"""The remote A2A agents a saga allows: only managers allow and remove them (REST and the saga
page), URLs are checked, and an agent's call names an allowed one or is refused with nothing
written. The calls themselves, over a real gateway, are in tests/gateways/test_a2a_outbound.py."""

import json
from typing import Any
from unittest.mock import ANY

import pytest
from django.conf import LazySettings
from django.test import Client

from accounts.models import User
from gateways.a2a import outbound
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.models import RemoteAgent, RemoteCall, SteeringItem
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team

pytestmark = pytest.mark.usefixtures("fast_passwords")

URL = "https://agents.example.com/a2a/translator/"


def api(team: Team) -> str:
    return f"/api/v1/sagas/{team.saga.pk}/remote-agents/"


def types(team: Team) -> list[str]:
    return list(
        JournalEvent.objects.for_saga(team.saga.pk)
        .filter(type__startswith="remote_agent.")
        .values_list("type", flat=True)
    )


def test_managers_allow_and_remove_remote_agents_over_rest(team: Team, alice: User, bob: User, mallory: User) -> None:
    body = {"name": "translator", "url": URL, "token_env": "TRANSLATOR_TOKEN"}

    problem(client_for(bob).post(api(team), body, format="json"), 403, "forbidden")  # a colleague
    problem(client_for(mallory).post(api(team), body, format="json"), 404, "not_found")  # an outsider
    problem(client_for(team.user("coder"), "Bearer").post(api(team), body, format="json"), 403, "forbidden")
    assert not RemoteAgent.objects.exists() and types(team) == []

    created = client_for(alice).post(api(team), body, format="json")
    assert created.status_code == 201, created.content
    assert created.json() | {"created_at": None} == body | {"added_by": "human:alice", "created_at": None}
    again = client_for(alice).post(api(team), {"name": "other", "url": URL}, format="json")
    assert problem(again, 409, "name_taken")["errors"] == {"url": ["Taken."]}
    taken = client_for(alice).post(api(team), {"name": "translator", "url": URL + "x/"}, format="json")
    assert problem(taken, 409, "name_taken")["errors"] == {"name": ["Taken."]}

    listed = client_for(bob).get(api(team))  # whoever sees the saga sees the list
    assert [r["name"] for r in listed.json()["remote_agents"]] == ["translator"]
    assert client_for(team.user("coder"), "Bearer").get(api(team)).status_code == 200
    problem(client_for(mallory).get(api(team)), 404, "not_found")

    problem(client_for(bob).delete(api(team) + "translator/"), 403, "forbidden")
    problem(client_for(alice).delete(api(team) + "nobody/"), 404, "not_found")
    assert client_for(alice).delete(api(team) + "translator/").status_code == 204
    assert not RemoteAgent.objects.exists()
    assert types(team) == ["remote_agent.allowed", "remote_agent.removed"]


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://agents.example.com/a2a/", "http(s)"),
        ("not a url", "http(s)"),
        ("https://user:secret@agents.example.com/a2a/", "No credentials"),
        ("http://127.0.0.1:8000/a2a/x/", "Not a public address"),
        ("http://10.1.2.3/a2a/x/", "Not a public address"),
        ("http://[::1]:8000/a2a/x/", "Not a public address"),
        # Hosts the URL validator takes and no resolver does (IDNA refuses them): refused, not a 500.
        ("http://" + "ü" * 60 + ".com/a2a/", "http(s)"),
        ("http://\u00ad.example.com/a2a/", "http(s)"),
    ],
)
def test_bad_and_private_urls_are_refused_with_nothing_written(
    team: Team, alice: User, settings: LazySettings, url: str, fragment: str
) -> None:
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = False
    refused = problem(
        client_for(alice).post(api(team), {"name": "x", "url": url}, format="json"), 400, "invalid_payload"
    )
    assert fragment in json.dumps(refused["errors"]["url"])
    assert not RemoteAgent.objects.exists() and types(team) == []


def test_private_urls_are_allowed_where_the_setting_says_so(team: Team, alice: User, settings: LazySettings) -> None:
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = True
    remote = actions.allow_remote_agent(saga=team.saga, name="local", url="http://127.0.0.1:8000/a2a/x/", by=alice)
    assert remote.url == "http://127.0.0.1:8000/a2a/x/"


def test_a_token_variable_is_a_name_never_a_value(team: Team, alice: User) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        actions.allow_remote_agent(saga=team.saga, name="x", url=URL, token_env="Bearer abc", by=alice)
    assert refused.value.extra["errors"] == {"token_env": ["The name of an environment variable, or nothing."]}


def test_an_agent_calls_only_allowed_remote_agents(team: Team, alice: User, settings: LazySettings) -> None:
    actions.allow_remote_agent(saga=team.saga, name="translator", url=URL, by=alice)
    coder = team["coder"]
    for named in ("elsewhere", "https://agents.example.com/a2a/translator", URL + "?x=1", None):
        with pytest.raises(errors.RemoteNotAllowed) as refused:
            actions.call_remote_agent(caller=coder, agent=named, message="hi")
        assert refused.value.code == "remote_not_allowed" and "allowed: translator" in refused.value.detail
    assert not RemoteCall.objects.exists()

    by_name, new = actions.call_remote_agent(caller=coder, agent="translator", message="hi", idempotency_key="k")
    assert new and by_name.url == URL and by_name.status == "pending"
    replayed, new = actions.call_remote_agent(caller=coder, agent="translator", message="hi", idempotency_key="k")
    assert replayed.pk == by_name.pk and not new
    by_url, _ = actions.call_remote_agent(caller=coder, agent=URL, message={"n": 1}, mode="wait", timeout_s=5)
    assert by_url.remote_agent is not None and by_url.remote_agent.name == "translator"

    with pytest.raises(errors.InvalidPayload):
        actions.call_remote_agent(caller=coder, agent="translator", message="hi", timeout_s="soon")
    with pytest.raises(errors.InvalidPayload):
        actions.call_remote_agent(caller=coder, agent="translator", message="hi", mode="later")
    settings.AGORA_A2A_REMOTE_MAX_OPEN = 2
    with pytest.raises(errors.TooManyPending):
        actions.call_remote_agent(caller=coder, agent="translator", message="one more")
    assert RemoteCall.objects.count() == 2
    events = JournalEvent.objects.for_saga(team.saga.pk).filter(type="remote_request")
    assert [e.data["call_id"] for e in events] == [by_name.pk, by_url.pk]


def test_the_saga_page_lists_them_and_managers_allow_and_remove_them(
    team: Team, alice: User, bob: User, settings: LazySettings
) -> None:
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = False
    owner, colleague = Client(), Client()
    owner.force_login(alice)
    colleague.force_login(bob)
    page = f"/sagas/{team.saga.pk}/"
    allow, remove = page + "remote-agents/", page + "remote-agents/remove/"

    assert colleague.post(allow, {"name": "translator", "url": URL}).status_code == 403
    refused = owner.post(allow, {"name": "translator", "url": "http://127.0.0.1/a2a/"})
    assert refused.status_code == 400 and "Not a public address" in refused.content.decode()
    assert not RemoteAgent.objects.exists()

    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = True  # the example host need not resolve here
    allowed = owner.post(allow, {"name": "translator", "url": URL, "token_env": "TRANSLATOR_TOKEN"})
    assert allowed.status_code == 302 and allowed["Location"].endswith("#remote-agents")
    seen_by_colleague = colleague.get(page).content.decode()
    assert 'data-remote-agent="translator"' in seen_by_colleague and URL in seen_by_colleague
    assert 'id="remote-agent-form"' not in seen_by_colleague  # no form for a non-manager
    owners_page = owner.get(page).content.decode()
    assert 'id="remote-agent-form"' in owners_page and "allowed remote agent translator" in owners_page

    assert colleague.post(remove, {"name": "translator"}).status_code == 403
    assert owner.post(remove, {"name": "translator"}).status_code == 302
    assert not RemoteAgent.objects.exists()


def test_a_removed_agent_or_a_passed_deadline_ends_an_open_call_once(team: Team, alice: User) -> None:
    """The follower's first checks, before any exchange: what fails a call without a word sent."""
    actions.allow_remote_agent(saga=team.saga, name="translator", url=URL, by=alice)
    coder = team["coder"]
    revoked, _ = actions.call_remote_agent(caller=coder, agent="translator", message="one")
    actions.remove_remote_agent(saga=team.saga, name="translator", by=alice)
    actions.allow_remote_agent(saga=team.saga, name="translator", url=URL, by=alice)  # no help to the first call
    late, _ = actions.call_remote_agent(caller=coder, agent="translator", message="two", timeout_s=0.001)

    outbound.follow(revoked.pk, 0)
    outbound.follow(revoked.pk, 0)  # a duplicated doorbell: the step was claimed, nothing happens
    outbound.follow(late.pk, 0)

    revoked.refresh_from_db()
    late.refresh_from_db()
    assert (revoked.status, revoked.error) == ("failed", {"code": "remote_not_allowed", "message": ANY})
    assert (late.status, late.error) == ("failed", {"code": "timeout", "message": ANY})
    items = SteeringItem.objects.filter(recipient=coder, sender="remote:translator")
    outcomes: list[Any] = [i.payload for i in items]
    assert [(o["call_id"], o["error"]["code"]) for o in outcomes] == [
        (revoked.pk, "remote_not_allowed"),
        (late.pk, "timeout"),
    ]
    assert revoked.attempts == late.attempts == 0  # nothing was sent


def test_a_call_whose_caller_ended_ends_at_its_next_step(team: Team, alice: User) -> None:
    actions.allow_remote_agent(saga=team.saga, name="translator", url=URL, by=alice)
    coder = team["coder"]
    call, _ = actions.call_remote_agent(caller=coder, agent="translator", message="one")
    with actions.saga_transaction(team.saga):  # as a shutdown, a cancelled prompt or the saga's end do
        actions.end_run(run=team.run("coder"), status="cancelled", reason="Cancelled.", actor="human:alice")

    outbound.follow(call.pk, 0)

    call.refresh_from_db()
    assert (call.status, call.error) == ("failed", {"code": "caller_ended", "message": ANY})
    assert call.attempts == 0  # nothing was sent
    assert [e.data["error"]["code"] for e in JournalEvent.objects.filter(saga=team.saga, type="remote_reply")] == [
        "caller_ended"
    ]


def test_a_steps_lease_is_renewed_only_while_its_worker_holds_that_step(team: Team, alice: User) -> None:
    actions.allow_remote_agent(saga=team.saga, name="translator", url=URL, by=alice)
    call, _ = actions.call_remote_agent(caller=team["coder"], agent="translator", message="one")
    claimed = actions.claim_remote_step(call_id=call.pk, step=0, lease_s=1)
    assert claimed is not None and claimed.lease_until is not None

    assert actions.renew_remote_step(call_id=call.pk, step=claimed.step, lease_s=60)
    renewed = RemoteCall.objects.get(pk=call.pk).lease_until
    assert renewed is not None and (renewed - claimed.lease_until).total_seconds() > 50
    assert not actions.renew_remote_step(call_id=call.pk, step=claimed.step - 1, lease_s=60)  # a stale step
    actions.schedule_remote_step(call=claimed, delay_s=1, failures=0, attempts=1)  # the step ended: no lease
    assert not actions.renew_remote_step(call_id=call.pk, step=claimed.step, lease_s=60)
    assert RemoteCall.objects.get(pk=call.pk).lease_until is None


def test_the_admin_shows_endpoints_and_calls_read_only(team: Team, alice: User, admin_client: Client) -> None:
    remote = actions.allow_remote_agent(saga=team.saga, name="translator", url=URL, by=alice)
    call, _ = actions.call_remote_agent(caller=team["coder"], agent="translator", message={"text": "bonjour"})
    for model, pk in (("remoteagent", remote.pk), ("remotecall", call.pk)):
        listed = admin_client.get(f"/admin/sagas/{model}/")
        assert listed.status_code == 200 and "translator" in listed.content.decode()
        shown = admin_client.get(f"/admin/sagas/{model}/{pk}/change/")
        assert shown.status_code == 200
        assert admin_client.get(f"/admin/sagas/{model}/add/").status_code == 403
    assert "bonjour" in admin_client.get(f"/admin/sagas/remotecall/{call.pk}/change/").content.decode()
