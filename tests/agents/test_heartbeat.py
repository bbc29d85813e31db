"""The process's heartbeat thread renews the leases of the turns its tasks run."""

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import LazySettings
from django.db.backends.signals import connection_created

from accounts.models import User
from agents.heartbeat import Heartbeat
from sagas import actions
from sagas.models import Run
from tests.sagas.kernel import profile_named
from tests.support import wait_until


@pytest.fixture
def run(alice: User) -> Run:
    """An internal agent's queued run."""
    saga = actions.create_saga(title="Beats", owner=alice)
    agent, _ = actions.add_agent(
        saga=saga, name="a", role="A", task="Think", runtime="internal", profile=profile_named("x"), by=alice
    )
    return Run.objects.get(pk=agent.run.pk)


@pytest.fixture
def renewals(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each lease renewal found its turn, in order."""
    answers: list[bool] = []
    renew = actions.renew_lease

    def counting(**kwargs: Any) -> bool:
        answers.append(renew(**kwargs))
        return answers[-1]

    monkeypatch.setattr(actions, "renew_lease", counting)
    return answers


@pytest.mark.django_db(transaction=True)
def test_a_turn_registered_before_its_claim_is_renewed_once_claimed(
    run: Run, renewals: list[bool], settings: LazySettings
) -> None:
    settings.AGORA_LEASE_S = 0.6  # a beat every 0.2 s
    heartbeat = Heartbeat()
    turns: Any = SimpleNamespace(run=run, turn=run.turn + 1)  # as a task registers it, before its claim
    heartbeat.add(turns)
    heartbeat.start()
    try:
        wait_until(lambda: renewals, what="a beat before the claim")  # finds no running turn: renews nothing
        assert renewals[0] is False

        assert actions.claim_turn(run_id=run.pk) is not None
        claimed = Run.objects.get(pk=run.pk).lease_until
        assert claimed is not None

        renewed = wait_until(
            lambda: (Run.objects.get(pk=run.pk).lease_until or claimed) > claimed, what="a renewal after the claim"
        )
        assert renewed and any(renewals)
    finally:
        heartbeat.remove(turns)


@pytest.mark.django_db(transaction=True)
def test_a_long_turn_is_renewed_beat_after_beat_over_one_connection(
    run: Run, renewals: list[bool], settings: LazySettings
) -> None:
    """A slow model call keeps its lease through many beats; the heartbeat thread keeps its one
    connection while the turn beats, rather than connecting to the database at every beat."""
    settings.AGORA_LEASE_S = 0.3  # a beat every 0.1 s
    claimed = actions.claim_turn(run_id=run.pk)
    assert claimed is not None
    connected: list[str] = []

    def noted(**kwargs: Any) -> None:
        connected.append(threading.current_thread().name)

    connection_created.connect(noted)
    heartbeat = Heartbeat()
    turns: Any = SimpleNamespace(run=claimed, turn=claimed.turn)
    heartbeat.add(turns)
    heartbeat.start()
    try:
        wait_until(lambda: len(renewals) >= 4, what="four beats")
    finally:
        heartbeat.remove(turns)
        connection_created.disconnect(noted)

    assert all(renewals[:4])
    assert connected.count("heartbeat") == 1, connected
