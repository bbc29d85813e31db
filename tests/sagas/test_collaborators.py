"""Sagas and collaborators: creating them, the delegation tree, run rows, and `get_collaborators`
(the collaborator cards an agent sees)."""

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.models import UserObjectPermission
from guardian.shortcuts import get_perms

from accounts.models import ApiToken, User, hash_token
from sagas import errors
from sagas.access import (
    ADDRESS_PERM,
    SagaTree,
    collaborator_card,
    forget_permission_ids,
    may_address,
    visible_collaborators,
    warm_permission_ids,
)
from sagas.actions import NewAgent, add_agent, add_agents, add_human, create_saga
from sagas.models import Collaborator, Delegation, Run, Saga
from tests.sagas.kernel import Team, field_errors, journal, last_seq, profile_named, queued_turns

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def cards(caller: Collaborator) -> dict[str, dict[str, Any]]:
    """`get_collaborators()` as caller sees it, by id."""
    return {card["id"]: card for card in map(collaborator_card, visible_collaborators(caller))}


def test_create_saga_makes_the_owner_a_human_collaborator_and_journals_it(alice: User) -> None:
    saga = create_saga(title="Migrate the API", goal="Ship v2", policy=Saga.Policy.HUB, owner=alice)

    owner = Collaborator.objects.get(saga=saga)
    assert (owner.handle, owner.kind, owner.role, owner.runtime) == ("human:alice", "human", "Owner", "")
    assert {"view_saga", "manage_saga"} <= set(get_perms(alice, saga))
    assert journal(saga) == [("saga.created", "human:alice"), ("collaborator.joined", "human:alice")]


@pytest.mark.parametrize(
    ("title", "policy", "field"), [("  ", Saga.Policy.TREE, "title"), ("Fine", "anarchy", "policy")]
)
def test_create_saga_refuses_bad_input(alice: User, title: str, policy: str, field: str) -> None:
    with pytest.raises(errors.InvalidPayload) as refused:
        create_saga(title=title, policy=policy, owner=alice)

    assert field in field_errors(refused)
    assert not Saga.objects.exists()


def test_the_tree_is_built_from_delegations_and_every_join_is_journaled(team: Team) -> None:
    edges = set(Delegation.objects.filter(saga=team.saga).values_list("delegator__name", "delegate__name"))

    assert edges == {
        ("alice", "lead"),
        ("alice", "scout"),
        ("lead", "coder"),
        ("lead", "reviewer"),
        ("coder", "tester"),
    }
    assert journal(team.saga) == [
        ("saga.created", "human:alice"),
        ("collaborator.joined", "human:alice"),
        ("collaborator.joined", "human:alice"),  # bob, added by alice
        *[("collaborator.joined", "human:alice")] * 5,
    ]


def test_an_agent_adds_its_own_delegate_and_is_the_journaled_actor(team: Team) -> None:
    mark = last_seq(team.saga)

    helper, token = add_agent(
        saga=team.saga, name="helper", role="Helper", task="Fixtures", runtime="external", by=team.user("tester")
    )

    assert helper.delegation.delegator == team["tester"]
    assert token is not None
    assert journal(team.saga, after=mark) == [("collaborator.joined", "agent:tester")]
    joined = team.saga.journal_events.get(seq=mark + 1)
    assert joined.data["parent"] == "agent:tester"
    assert joined.run_id == helper.run.pk


def test_an_agent_cannot_add_delegates_under_someone_else(team: Team) -> None:
    with pytest.raises(errors.Forbidden):
        add_agent(
            saga=team.saga,
            name="mole",
            role="",
            task="",
            runtime="external",
            parent="agent:lead",
            by=team.user("coder"),
        )

    assert not Collaborator.objects.filter(name="mole").exists()


def test_a_name_under_an_agents_name_is_only_for_its_own_delegates(team: Team, alice: User) -> None:
    """`tester.fixtures` is agent:tester's to give (as an orchestration's lead names its workers):
    neither a fellow agent nor a manager takes it first under anyone else; a dotted name under no
    agent's is anyone's."""
    mark = last_seq(team.saga)
    squats = [(team.user("coder"), None), (alice, "agent:lead"), (alice, None)]
    for by, parent in squats:
        with pytest.raises(errors.NameTaken, match="under agent:tester's name"):
            add_agent(saga=team.saga, name="tester.fixtures", role="", task="", runtime="external", parent=parent,
                      by=by)  # fmt: skip
    assert last_seq(team.saga) == mark
    assert not Collaborator.objects.filter(saga=team.saga, name="tester.fixtures").exists()
    mine, _ = add_agent(
        saga=team.saga, name="tester.fixtures", role="", task="", runtime="external", by=team.user("tester")
    )
    theirs, _ = add_agent(saga=team.saga, name="tester.fixtures.data", role="", task="", runtime="external",
                          parent="agent:tester.fixtures", by=alice)  # fmt: skip
    free, _ = add_agent(saga=team.saga, name="scribe.v2", role="", task="", runtime="external", by=alice)
    assert mine.delegation.delegator == team["tester"]
    assert theirs.delegation.delegator == mine
    assert free.delegation.delegator.handle == "human:alice"


@pytest.mark.parametrize("who", ["bob", "mallory"])
def test_only_managers_add_collaborators(team: Team, who: str, request: pytest.FixtureRequest) -> None:
    user: User = request.getfixturevalue(who)
    mark = last_seq(team.saga)

    with pytest.raises(errors.Forbidden):
        add_agent(saga=team.saga, name="rogue", role="", task="", runtime="external", by=user)
    with pytest.raises(errors.Forbidden):
        add_human(saga=team.saga, user=user, role="", task="", by=user)

    assert not Collaborator.objects.filter(name="rogue").exists()
    assert last_seq(team.saga) == mark


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"name": "Bad Name"}, errors.InvalidPayload, "name"),
        ({"runtime": "cloud"}, errors.InvalidPayload, "runtime"),
        ({"runtime": "internal"}, errors.InvalidPayload, "profile"),
        ({"runtime": "internal", "profile": "no-such-profile"}, errors.InvalidPayload, "profile"),
        ({"name": "coder"}, errors.NameTaken, None),
        ({"parent": "agent:nobody"}, errors.NotFound, None),
    ],
)
def test_add_agent_refuses_bad_input_and_stores_nothing(
    team: Team, alice: User, options: dict[str, str], error: type[errors.KernelError], field: str | None
) -> None:
    before = (Collaborator.objects.count(), Run.objects.count(), User.objects.count(), last_seq(team.saga))
    arguments: dict[str, Any] = {"name": "newbie", "role": "", "task": "", "runtime": "external", **options}

    with pytest.raises(error) as refused:
        add_agent(saga=team.saga, by=alice, **arguments)

    if field:
        assert field in field_errors(refused)
    assert (Collaborator.objects.count(), Run.objects.count(), User.objects.count(), last_seq(team.saga)) == before


def test_the_kernel_asks_the_runtime_which_profiles_exist(team: Team, alice: User, settings: Any) -> None:
    """The kernel never imports the runtime: the callable that `AGORA_MISSING_PROFILES` names answers."""
    ASKED.clear()
    settings.AGORA_MISSING_PROFILES = f"{__name__}.{remember_and_refuse.__name__}"

    with pytest.raises(errors.InvalidPayload) as refused:
        add_agent(saga=team.saga, name="newbie", role="", task="", runtime="internal", profile="x", by=alice)

    assert [{"x"}] == ASKED and "profile" in field_errors(refused)
    assert not Collaborator.objects.filter(saga=team.saga, name="newbie").exists()


ASKED: list[set[str]] = []


def remember_and_refuse(names: set[str]) -> set[str]:
    ASKED.append(names)
    return names


def test_an_external_agent_gets_a_token_once_and_only_its_hash_is_kept(team: Team, alice: User) -> None:
    agent, token = add_agent(saga=team.saga, name="ext", role="", task="", runtime="external", by=alice)

    assert token is not None and token.startswith("agt_")
    stored = ApiToken.objects.get(user=agent.user)
    assert stored.key_hash == hash_token(token)
    assert token not in {stored.key_hash, stored.prefix}
    assert not agent.user.has_usable_password()
    assert agent.run.status == Run.Status.IDLE


def test_an_internal_agent_gets_a_queued_run_and_its_first_turn_is_rung_after_commit(
    team: Team, alice: User, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        agent, token = add_agent(
            saga=team.saga, name="worker", role="", task="", runtime="internal", by=alice,
            profile=profile_named("responder"),
        )  # fmt: skip

    assert token is None
    assert not ApiToken.objects.filter(user=agent.user).exists()
    assert agent.run.status == Run.Status.QUEUED
    assert queued_turns(redis_url) == [agent.run.pk]


def test_agents_added_at_once_are_each_what_add_agent_makes_and_one_may_wait_to_be_run(
    team: Team, alice: User, redis_url: str, django_capture_on_commit_callbacks: Any
) -> None:
    responder = profile_named("responder")
    with django_capture_on_commit_callbacks(execute=True):
        added = add_agents(
            saga=team.saga, by=alice, parent="agent:coder",
            agents=[NewAgent(name=f"w{i}", role="Worker", task=f"Part {i}", runtime="internal", profile=responder,
                             ring=i > 0) for i in range(3)],
        )  # fmt: skip

    agents = [c for c, _ in added]
    assert [a.handle for a in agents] == ["agent:w0", "agent:w1", "agent:w2"]
    for agent in agents:
        agent.refresh_from_db()
        assert agent.delegation.delegator.handle == "agent:coder" and agent.run.status == Run.Status.QUEUED
        assert alice.has_perm("sagas.view_saga", team.saga) and agent.user.has_perm("sagas.view_saga", team.saga)
    # w0's caller runs it itself: only the others' first turns were rung.
    assert sorted(queued_turns(redis_url)) == sorted(a.run.pk for a in agents[1:])
    assert journal(team.saga)[-3:] == [("collaborator.joined", "human:alice")] * 3
    # Each may address its delegator, as after add_agent (the saga's policy grants it).
    assert all(may_address(a, team["coder"]) for a in agents)


@pytest.mark.parametrize("policy", Saga.Policy.values)
def test_the_address_grants_written_one_join_at_a_time_are_the_policys_for_the_whole_tree(
    make_team: Any, alice: User, policy: str
) -> None:
    team = make_team(policy=policy)
    add_agents(
        saga=team.saga, by=alice, parent="agent:scout",
        agents=[NewAgent(name=f"w{i}", role="Worker", task="t", runtime="external") for i in range(2)],
    )  # fmt: skip

    tree = SagaTree.load(team.saga)
    wanted = {(tree.members[a].user_id, str(b)) for a in tree.members for b in tree.addressable_ids(tree.members[a])}
    held = UserObjectPermission.objects.filter(
        permission__codename=ADDRESS_PERM, object_pk__in=[str(pk) for pk in tree.members]
    ).values_list("user_id", "object_pk")
    assert wanted and set(held) == wanted


def test_a_delegation_reads_no_permission_and_its_profiles_once_however_many_it_adds(team: Team, alice: User) -> None:
    profiles = [profile_named(name) for name in ("planner", "writer", "checker")]

    def delegate(names: list[str]) -> list[str]:
        agents = [
            NewAgent(name=n, role="R", task="t", runtime="internal", profile=p)
            for n, p in zip(names, profiles[: len(names)], strict=True)
        ]
        with CaptureQueriesContext(connection) as queries:
            add_agents(saga=team.saga, by=alice, parent="agent:coder", agents=agents)
        return [q["sql"] for q in queries.captured_queries]

    one, three = delegate(["a1"]), delegate(["b1", "b2", "b3"])

    listing = "\n".join(s[:120] for s in three)
    assert sum("agents_agentprofile" in s for s in three) == 1, listing
    assert not any(s.startswith("SELECT") and ("auth_permission" in s or "guardian_" in s) for s in three), listing
    # Only the journal grows with the number of agents: one event each.
    written = [len([s for s in sent if "journal_" not in s]) for sent in (one, three)]
    assert written[0] == written[1], listing


@pytest.mark.django_db(transaction=True)
def test_a_worker_reads_the_granted_permissions_once_before_its_pool_processes_fork(alice: User) -> None:
    """What `worker_init` runs in a worker's parent process: the children it forks then start with
    the ids, and with no connection of the parent's."""
    saga = create_saga(title="t", owner=alice)
    profile = profile_named("planner")
    forget_permission_ids()  # as a process that has granted nothing yet

    warm_permission_ids()

    assert connection.connection is None
    with CaptureQueriesContext(connection) as queries:
        add_agent(saga=saga, name="a", role="R", task="t", runtime="internal", profile=profile, by=alice)
    sent = [q["sql"] for q in queries.captured_queries]
    assert not any("django_content_type" in s or "auth_permission" in s for s in sent), sent
    assert {"view_saga"} <= set(get_perms(Collaborator.objects.get(name="a").user, saga))


def test_add_human_grants_view_and_journals_the_manager(team: Team, alice: User, mallory: User) -> None:
    mark = last_seq(team.saga)

    add_human(saga=team.saga, user=mallory, role="Auditor", task="Audit", by=alice)

    assert "view_saga" in get_perms(mallory, team.saga)
    assert "manage_saga" not in get_perms(mallory, team.saga)
    assert Saga.objects.visible_to(mallory).filter(pk=team.saga.pk).exists()
    assert journal(team.saga, after=mark) == [("collaborator.joined", "human:alice")]
    with pytest.raises(errors.NameTaken):
        add_human(saga=team.saga, user=mallory, role="", task="", by=alice)


def test_an_agent_user_cannot_join_as_a_person(team: Team, alice: User) -> None:
    with pytest.raises(errors.InvalidPayload):
        add_human(saga=team.saga, user=team.user("coder"), role="", task="", by=alice)


# --- get_collaborators -------------------------------------------------------------------------


def test_get_collaborators_includes_nested_delegations_with_both_kinds(team: Team) -> None:
    seen = cards(team["lead"])

    assert set(seen) == {
        "agent:lead",
        "agent:coder",
        "agent:reviewer",
        "agent:tester",  # a delegate's delegate
        "agent:scout",  # a sibling under the owner (tree policy)
        "human:alice",
        "human:bob",
    }
    assert seen["agent:tester"] == {
        "id": "agent:tester",
        "kind": "agent",
        "role": "Tester",
        "task": "tester's part",
        "status": "idle",
        "run_id": team.run("tester").pk,
    }
    assert seen["human:bob"] == {"id": "human:bob", "kind": "human", "role": "Analyst", "task": "Requirements"}
    assert {card["kind"] for card in seen.values()} == {"agent", "human"}


def test_cards_follow_the_run_status(team: Team) -> None:
    Run.objects.filter(pk=team.run("coder").pk).update(status=Run.Status.COMPLETED)

    assert cards(team["lead"])["agent:coder"]["status"] == "completed"


def test_get_collaborators_reveals_no_usernames_tokens_or_emails(make_team: Any, alice: User, bob: User) -> None:
    alice.email, bob.email = "alice@example.com", "bob@example.com"
    alice.save()
    bob.save()
    team: Team = make_team()
    _, token = add_agent(
        saga=team.saga, name="ext", role="", task="", runtime="external", parent="agent:lead", by=alice
    )
    assert token is not None
    secrets = [token, *ApiToken.objects.values_list("key_hash", flat=True)]
    secrets += [u.username for u in User.objects.filter(kind=User.Kind.AGENT)]  # service users
    secrets += [p for p in User.objects.values_list("password", flat=True) if p]  # hashes, usable or not
    secrets += ["alice@example.com", "bob@example.com", "password", "email", "token"]

    for caller in ("lead", "coder", "ext"):  # its delegator, a sibling, itself
        exposed = json.dumps(cards(team[caller]))
        assert "agent:ext" in exposed  # the cards are there, with the people's and agents' ids
        for secret in secrets:
            assert secret not in exposed, f"{secret!r} leaked to agent:{caller}"
    for card in cards(team["lead"]).values():
        assert set(card) <= {"id", "kind", "role", "task", "status", "run_id"}


def test_get_collaborators_loads_the_tree_in_a_fixed_number_of_queries(
    make_team: Any, alice: User, django_assert_max_num_queries: Any
) -> None:
    team: Team = make_team()
    for i in range(10):
        add_agent(
            saga=team.saga, name=f"extra-{i}", role="", task="", runtime="external", parent="agent:lead", by=alice
        )
    lead = team["lead"]

    with django_assert_max_num_queries(4):
        seen = cards(lead)

    assert len(seen) == 17
