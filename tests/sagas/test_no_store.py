"""Every response that carries a token says `Cache-Control: no-store`, so that no browser, proxy or
CDN keeps it: the token exchange, an external agent added over REST, and the dashboard page that
shows a new agent's token once. Responses without a token are left to the defaults."""

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import User
from tests.sagas.api_http import client_for
from tests.sagas.kernel import Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def no_store(response: Any) -> bool:
    header = response.headers.get("Cache-Control", "")
    return "no-store" in {d.strip() for d in header.split(",")}


def test_the_token_exchange_is_not_stored(alice: User) -> None:
    issued = APIClient().post("/api/v1/auth/token/", {"username": "alice", "password": "alice-password"}, format="json")
    assert issued.status_code == 200 and issued.data["token"]
    assert no_store(issued)


def test_an_external_agent_added_over_rest_is_not_stored(team: Team, alice: User, mallory: User) -> None:
    api = client_for(alice)
    url = f"/api/v1/sagas/{team.saga.pk}/collaborators/"
    external = api.post(url, {"kind": "agent", "name": "outside", "runtime": "external"}, format="json")
    assert external.status_code == 201 and external.data["token"]
    assert no_store(external)
    person = api.post(url, {"kind": "human", "username": "mallory"}, format="json")
    assert person.status_code == 201 and "token" not in person.data
    assert not no_store(person)


def test_the_dashboard_page_showing_a_new_token_is_not_stored(team: Team, alice: User) -> None:
    browser = Client()
    browser.force_login(alice)
    shown = browser.post(f"/sagas/{team.saga.pk}/agents/", {"name": "outside", "runtime": "external"})
    assert shown.status_code == 201 and "agt_" in shown.content.decode()
    assert no_store(shown)
