"""Exposing an agent to A2A clients: a manager's journaled decision, on agents only."""

import pytest

from accounts.models import User
from sagas import errors
from sagas.actions import set_exposed
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
