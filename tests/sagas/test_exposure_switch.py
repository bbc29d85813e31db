"""The dashboard's switch that exposes an agent to A2A clients (or withdraws it): a plain form on
the agent's row of the saga page, for managers only, and the card's address once it is exposed."""

import pytest
from django.test import Client
from django.test.utils import override_settings

from accounts.models import User
from gateways.a2a.cards import agent_path
from journal.models import JournalEvent
from tests.sagas.kernel import Team

pytestmark = pytest.mark.usefixtures("fast_passwords")


def browser_for(user: User) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def test_a_manager_exposes_and_withdraws_an_agent_from_the_saga_page(team: Team, alice: User) -> None:
    browser = browser_for(alice)
    page = f"/sagas/{team.saga.pk}/"
    switch = f"/sagas/{team.saga.pk}/exposure/"
    before = browser.get(page).content.decode()
    assert f'action="{switch}"' in before and "Expose over A2A" in before and "A2A card" not in before

    exposed = browser.post(switch, {"agent": "agent:coder", "exposed": "1"}, follow=True)
    assert exposed.redirect_chain[-1][0].endswith("#team")
    assert team["coder"].exposed
    card = f"http://testserver{agent_path(team['coder'])}.well-known/agent-card.json"  # the gateway's route
    html = exposed.content.decode()
    assert f'href="{card}"' in html and "Withdraw from A2A" in html
    assert f"its card: {card}" in html  # the flash message names it too

    with override_settings(AGORA_PUBLIC_URL="https://agora.example.com"):
        public = browser.get(page).content.decode()
    assert f'href="https://agora.example.com{agent_path(team["coder"])}.well-known/agent-card.json"' in public

    assert browser.post(switch, {"agent": "agent:coder", "exposed": "0"}).status_code == 302
    assert not team["coder"].exposed
    assert "A2A card" not in browser.get(page).content.decode()
    events = JournalEvent.objects.filter(saga=team.saga, type__startswith="collaborator.").values_list("type", "actor")
    assert [e for e in events if e[0] in ("collaborator.exposed", "collaborator.withdrawn")] == [
        ("collaborator.exposed", "human:alice"),
        ("collaborator.withdrawn", "human:alice"),
    ]


def test_only_managers_switch_and_only_agents_are_switched(team: Team, alice: User, bob: User, mallory: User) -> None:
    switch = f"/sagas/{team.saga.pk}/exposure/"
    colleague = browser_for(bob)
    assert colleague.post(switch, {"agent": "agent:coder", "exposed": "1"}).status_code == 403
    assert "Expose over A2A" not in colleague.get(f"/sagas/{team.saga.pk}/").content.decode()
    assert browser_for(mallory).post(switch, {"agent": "agent:coder", "exposed": "1"}).status_code == 404
    owner = browser_for(alice)
    assert owner.post(switch, {"agent": "agent:ghost", "exposed": "1"}).status_code == 404
    assert owner.post(switch, {"agent": "human:alice", "exposed": "1"}).status_code == 404
    assert owner.post(switch, {"agent": "agent:coder", "exposed": "yes"}).status_code == 400
    assert not team["coder"].exposed
