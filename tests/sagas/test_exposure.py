"""Exposing an agent to A2A clients: a manager's journaled decision, on agents only."""

import pytest

from accounts.models import User
from sagas import errors
from sagas.actions import set_exposed
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
