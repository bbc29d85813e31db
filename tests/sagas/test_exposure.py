"""Exposing an agent to A2A clients: a manager's journaled decision, on agents only."""

import pytest
from django.test import Client

from accounts.models import User
from sagas import errors
from sagas.actions import finish_saga, set_exposed
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team, journal, last_seq


def test_a_manager_exposes_and_withdraws_an_agent(team: Team, alice: User) -> None:
    lead = team.names[0]
    assert team[lead].exposed is False
    after = last_seq(team.saga)
    set_exposed(saga=team.saga, handle=f"agent:{lead}", exposed=True, by=alice)
    set_exposed(saga=team.saga, handle=f"agent:{lead}", exposed=True, by=alice)  # already so: nothing new
    assert team[lead].exposed is True
    set_exposed(saga=team.saga, handle=f"agent:{lead}", exposed=False, by=alice)
    assert team[lead].exposed is False
    assert journal(team.saga, after=after) == [
        ("collaborator.exposed", "human:alice"),
        ("collaborator.withdrawn", "human:alice"),
    ]


def test_only_managers_expose_and_only_agents(team: Team, alice: User, bob: User) -> None:
    lead = team.names[0]
    with pytest.raises(errors.Forbidden):
        set_exposed(saga=team.saga, handle=f"agent:{lead}", exposed=True, by=bob)
    with pytest.raises(errors.Forbidden):
        set_exposed(saga=team.saga, handle=f"agent:{lead}", exposed=True, by=team.user(lead))
    for handle in ("human:bob", "agent:nobody"):
        with pytest.raises(errors.NotFound):
            set_exposed(saga=team.saga, handle=handle, exposed=True, by=alice)
    assert team[lead].exposed is False


def test_the_api_exposes_for_managers_only(team: Team, alice: User, bob: User) -> None:
    lead = team.names[0]
    path = f"/api/v1/sagas/{team.saga.pk}/collaborators/agent:{lead}/exposure/"
    response = client_for(alice).post(path, {"exposed": True}, format="json")
    assert (response.status_code, response.json()) == (200, {"id": f"agent:{lead}", "exposed": True})
    assert team[lead].exposed is True
    problem(client_for(bob).post(path, {"exposed": False}, format="json"), 403, "forbidden")
    problem(client_for(alice).post(path, {"exposed": "maybe"}, format="json"), 400, "invalid_payload")
    assert team[lead].exposed is True


def test_a_finished_saga_exposes_no_agent_but_still_withdraws(team: Team, alice: User, bob: User) -> None:
    """An agent card is a door for new work: a finished saga opens none, as it refuses every write
    that starts work; closing one stays possible."""
    lead, scout = team.names[0], "scout"
    set_exposed(saga=team.saga, handle=f"agent:{lead}", exposed=True, by=alice)
    finish_saga(saga=team.saga, status="cancelled", by=alice)
    after = last_seq(team.saga)

    path = f"/api/v1/sagas/{team.saga.pk}/collaborators/agent:{scout}/exposure/"
    problem(client_for(alice).post(path, {"exposed": True}, format="json"), 409, "saga_finished")
    problem(client_for(bob).post(path, {"exposed": True}, format="json"), 403, "forbidden")  # who first, then when
    page = Client()
    page.force_login(alice)
    url = f"/sagas/{team.saga.pk}/exposure/"
    refused = page.post(url, {"agent": f"agent:{scout}", "exposed": "1"})
    assert (refused.status_code, refused.content) == (
        409,
        b"saga_finished: The saga is cancelled: it takes no new work.",
    )
    assert team[scout].exposed is False
    assert journal(team.saga, after=after) == []

    # The page offers only what it still takes: closing doors.
    html = page.get(f"/sagas/{team.saga.pk}/").content.decode()
    assert "Withdraw from A2A" in html and "Revoke token" in html
    assert "Expose over A2A" not in html and "New token" not in html
    assert page.post(url, {"agent": f"agent:{lead}", "exposed": "0"}).status_code == 302
    assert team[lead].exposed is False
    assert journal(team.saga, after=after) == [("collaborator.withdrawn", "human:alice")]
