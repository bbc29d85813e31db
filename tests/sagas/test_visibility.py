"""Who sees whom and who may address whom (DESIGN.md §4), checked on the tree, on the guardian
grants, and through `ask_agent` itself: not visible → not_found, visible but not allowed →
not_addressable."""

from typing import Any

import pytest

from accounts.models import User
from sagas import errors
from sagas.access import SagaTree, collaborator_card, may_address, visible_collaborators
from sagas.actions import add_agent, ask_agent
from sagas.models import AgentRequest, Collaborator, Saga, SteeringItem
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import AGENTS, Team, last_seq

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

HUMANS = {"human:alice", "human:bob"}

# What each agent of the TREE sees, besides itself and the people.
VISIBLE: dict[str, dict[str, set[str]]] = {
    Saga.Policy.HUB: {
        "lead": {"coder", "reviewer", "tester"},
        "scout": set(),
        "coder": {"lead", "tester"},
        "reviewer": {"lead"},
        "tester": {"coder", "lead"},
    },
    Saga.Policy.TREE: {
        "lead": {"coder", "reviewer", "tester", "scout"},
        "scout": {"lead"},
        "coder": {"lead", "tester", "reviewer"},
        "reviewer": {"lead", "coder"},
        "tester": {"coder", "lead"},
    },
}
VISIBLE[Saga.Policy.OPEN] = VISIBLE[Saga.Policy.TREE]

# Whom each agent may address under each policy.
ADDRESSABLE: dict[str, dict[str, set[str]]] = {
    Saga.Policy.HUB: {
        "lead": set(),  # its delegator is a person: people are asked through forms
        "scout": set(),
        "coder": {"lead"},
        "reviewer": {"lead"},
        "tester": {"coder"},
    },
    Saga.Policy.TREE: {
        "lead": {"coder", "reviewer", "scout"},
        "scout": {"lead"},
        "coder": {"lead", "tester", "reviewer"},
        "reviewer": {"lead", "coder"},
        "tester": {"coder"},
    },
    Saga.Policy.OPEN: {
        "lead": {"coder", "reviewer", "tester", "scout"},
        "scout": {"lead"},
        "coder": {"lead", "tester", "reviewer"},
        "reviewer": {"lead", "coder"},
        "tester": {"coder", "lead"},
    },
}
POLICIES = [Saga.Policy.HUB, Saga.Policy.TREE, Saga.Policy.OPEN]


def seen_by(team: Team, name: str) -> set[str]:
    return {c.handle for c in visible_collaborators(team[name])}


def expected_outcome(policy: str, sender: str, recipient: str) -> str:
    if recipient in ADDRESSABLE[policy][sender]:
        return "ok"
    if recipient in VISIBLE[policy][sender]:
        return "not_addressable"
    return "not_found"


def try_ask(team: Team, sender: str, to: str) -> str:
    try:
        ask_agent(sender=team[sender], to=to, type="ping", payload={})
    except errors.KernelError as exc:
        return exc.code
    return "ok"


@pytest.mark.parametrize("policy", POLICIES)
def test_agents_see_themselves_their_lineage_siblings_per_policy_and_every_person(
    make_team: MakeTeam, policy: str
) -> None:
    team = make_team(policy=policy)

    for name in AGENTS:
        expected = {f"agent:{n}" for n in VISIBLE[policy][name] | {name}} | HUMANS
        assert seen_by(team, name) == expected, name


def test_siblings_are_visible_under_tree_and_open_but_not_hub(make_team: MakeTeam) -> None:
    for policy in POLICIES:
        team = make_team(policy=policy, title=policy)
        sees_sibling = "agent:reviewer" in seen_by(team, "coder")
        assert sees_sibling is (policy != Saga.Policy.HUB), policy
        assert ("agent:scout" in seen_by(team, "lead")) is (policy != Saga.Policy.HUB), policy


def test_ancestors_and_descendants_are_visible_whatever_the_policy(make_team: MakeTeam) -> None:
    team = make_team(policy=Saga.Policy.HUB)

    assert {"agent:lead", "agent:coder"} <= seen_by(team, "tester")  # all the way up
    assert {"agent:coder", "agent:tester"} <= seen_by(team, "lead")  # all the way down
    assert "agent:reviewer" not in seen_by(team, "tester")  # an uncle is not lineage


@pytest.mark.parametrize("person", ["alice", "bob"])
def test_people_see_everyone(team: Team, person: str) -> None:
    everyone = {c.handle for c in Collaborator.objects.filter(saga=team.saga)}

    assert seen_by(team, person) == everyone
    assert len(everyone) == 7


def test_an_agent_of_another_saga_sees_nothing_of_ours(team: Team, other_team: Team) -> None:
    seen = seen_by(other_team, "spy")
    ours = {c.pk for c in Collaborator.objects.filter(saga=team.saga)}

    assert seen == {"agent:spy", "agent:lead", "human:mallory"}
    assert not ours & {c.pk for c in visible_collaborators(other_team["spy"])}
    run_ids = {card.get("run_id") for card in map(collaborator_card, visible_collaborators(other_team["spy"]))}
    assert run_ids - {None} == {other_team.run("spy").pk, other_team.run("lead").pk}
    assert not Saga.objects.visible_to(other_team.user("spy")).filter(pk=team.saga.pk).exists()


# --- addressing --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_address_grants_match_the_policy(make_team: MakeTeam, policy: str) -> None:
    team = make_team(policy=policy)
    agents = {name: team[name] for name in AGENTS}

    for sender in AGENTS:
        granted = {name for name in AGENTS if may_address(agents[sender], agents[name])}
        assert granted == ADDRESSABLE[policy][sender], sender
        assert {team.saga.collaborators.get(pk=i).name for i in SagaTree.load(team.saga).addressable_ids(
            agents[sender])} == ADDRESSABLE[policy][sender]  # fmt: skip


@pytest.mark.parametrize("policy", POLICIES)
def test_ask_agent_enforces_visibility_then_the_address_grant(make_team: MakeTeam, policy: str) -> None:
    team = make_team(policy=policy)

    got = {(s, r): try_ask(team, s, f"agent:{r}") for s in AGENTS for r in AGENTS if s != r}

    assert got == {(s, r): expected_outcome(policy, s, r) for s in AGENTS for r in AGENTS if s != r}
    accepted = sum(outcome == "ok" for outcome in got.values())
    assert AgentRequest.objects.filter(saga=team.saga).count() == accepted
    assert SteeringItem.objects.filter(recipient__saga=team.saga).count() == accepted


@pytest.mark.parametrize("policy", POLICIES)
def test_a_nested_delegate_never_reaches_beyond_its_delegator(make_team: MakeTeam, policy: str) -> None:
    team = make_team(policy=policy)
    tree = SagaTree.load(team.saga)

    for name in AGENTS:
        agent = team[name]
        delegator = tree.members[tree.parent[agent.pk]]
        if not delegator.is_agent:
            continue
        assert tree.addressable_ids(agent) <= tree.visible_ids(delegator), name
    assert try_ask(team, "tester", "agent:scout") == "not_found"  # lead's sibling, out of tester's reach


def test_an_outsider_cannot_tell_our_agents_from_absent_ones(team: Team, other_team: Team) -> None:
    # Mallory's saga also has an agent:lead; handles resolve only inside the caller's own saga.
    mark = last_seq(team.saga)
    refusals: list[Any] = []
    for to in ("agent:coder", "agent:nobody"):
        with pytest.raises(errors.NotFound) as refused:
            ask_agent(sender=other_team["spy"], to=to, type="probe", payload={})
        refusals.append((refused.value.code, refused.value.status))

    assert refusals[0] == refusals[1] == ("not_found", 404)
    assert not AgentRequest.objects.filter(recipient__saga=team.saga).exists()
    assert last_seq(team.saga) == mark


def test_people_are_not_addressed_with_ask_agent(team: Team) -> None:
    # The same answer for a person of the saga and for nobody: it tells which tool asks people.
    answers = []
    for to in ("human:alice", "human:nobody"):
        with pytest.raises(errors.InvalidPayload) as refused:
            ask_agent(sender=team["lead"], to=to, type="ping", payload={})
        answers.append(str(refused.value))
    assert answers[0] == answers[1] and "ask_human" in answers[0]
    assert not AgentRequest.objects.exists()


@pytest.mark.parametrize("to", ["lead", "agent:", "robot:lead", "agent:lead:x", ""])
def test_malformed_handles_are_not_found(team: Team, to: str) -> None:
    with pytest.raises(errors.NotFound):
        ask_agent(sender=team["coder"], to=to, type="ping", payload={})


def test_grants_are_recomputed_when_a_collaborator_joins(team: Team, alice: User) -> None:
    add_agent(saga=team.saga, name="designer", role="", task="", runtime="external", parent="agent:lead", by=alice)
    designer = team["designer"]

    # Under `tree`, the newcomer's siblings and delegator may address it, and it them.
    assert {n for n in AGENTS if may_address(team[n], designer)} == {"lead", "coder", "reviewer"}
    assert {n for n in AGENTS if may_address(designer, team[n])} == {"lead", "coder", "reviewer"}
    request, created = ask_agent(sender=team["reviewer"], to="agent:designer", type="ping", payload={})
    assert created and request.recipient == designer
    assert try_ask(team, "tester", "agent:designer") == "not_found"


def test_a_delegate_added_by_an_agent_gets_hub_grants(make_team: MakeTeam) -> None:
    team = make_team(policy=Saga.Policy.HUB)
    add_agent(saga=team.saga, name="intern", role="", task="", runtime="external", by=team.user("tester"))

    assert may_address(team["intern"], team["tester"])
    assert not may_address(team["tester"], team["intern"])
    assert try_ask(team, "intern", "agent:tester") == "ok"
    assert try_ask(team, "intern", "agent:coder") == "not_addressable"  # an ancestor, but not its delegator
    assert try_ask(team, "tester", "agent:intern") == "not_addressable"
