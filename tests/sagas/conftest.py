"""Fixtures for the kernel's tests: sagas with a small delegation tree of agents.

Agents are external unless a test asks otherwise, so no turn executor is needed: the tests play
each agent by calling the kernel's actions as its service user.
"""

from collections.abc import Callable, Iterable

import pytest
from django.conf import LazySettings
from django.utils import timezone

from accounts.models import User
from sagas.actions import add_agent, add_human, create_saga
from sagas.models import Collaborator, Saga
from tests.sagas.kernel import TREE, Clock, Team, profile_named

MakeTeam = Callable[..., Team]


def build_team(
    *,
    owner: User,
    policy: str = Saga.Policy.TREE,
    tree: Iterable[tuple[str, str | None]] = TREE,
    internal: Iterable[str] = (),
    resumable: Iterable[str] = (),
    humans: Iterable[User] = (),
    title: str = "Migrate the API",
    profile: str = "responder",
) -> Team:
    saga = create_saga(title=title, goal="Ship v2 of the API", policy=policy, owner=owner)
    internal, resumable = set(internal), set(resumable)
    if internal:
        profile_named(profile)
    for person in humans:
        add_human(saga=saga, user=person, role="Analyst", task="Requirements", by=owner)
    names = []
    for name, parent in tree:
        add_agent(
            saga=saga,
            name=name,
            role=name.title(),
            task=f"{name}'s part",
            runtime=Collaborator.Runtime.INTERNAL if name in internal else Collaborator.Runtime.EXTERNAL,
            profile=profile if name in internal else "",
            parent=None if parent is None else f"agent:{parent}",
            resumable=name in resumable,
            by=owner,
        )
        names.append(name)
    return Team(saga=saga, names=names)


@pytest.fixture
def fast_passwords(settings: LazySettings) -> None:
    """Hash the cast's passwords cheaply. Opt-in (`usefixtures`) rather than autouse: tests that hand
    a password to another process, whose settings lack this hasher, keep the default."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *settings.PASSWORD_HASHERS]


@pytest.fixture
def make_team(alice: User, bob: User) -> MakeTeam:
    """Alice's saga with the TREE of agents and bob as a collaborating person."""

    def make(**options: object) -> Team:
        options.setdefault("humans", [bob])
        return build_team(owner=alice, **options)  # type: ignore[arg-type]

    return make


@pytest.fixture
def team(make_team: MakeTeam) -> Team:
    """The TREE under the default `tree` policy."""
    return make_team()


@pytest.fixture
def other_team(mallory: User) -> Team:
    """Mallory's saga, unrelated to alice's: same agent names in part, and a `spy`."""
    return build_team(owner=mallory, tree=[("lead", None), ("spy", "lead")], title="Elsewhere")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Freeze `timezone.now()` for the kernel, the models' auto timestamps and the reconciler."""
    fake = Clock(timezone.now())
    monkeypatch.setattr(timezone, "now", fake)
    return fake
