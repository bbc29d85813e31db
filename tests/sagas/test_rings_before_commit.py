"""On PostgreSQL, a run's doorbell goes before the commit that gives it work, when the transaction
holds its saga's lock, granted already: the claim it brings takes that lock first, so it waits for
the commit and then reads what was committed; if the transaction rolls back, the claim takes
nothing. Without a granted lock the doorbell waits for the commit."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection, transaction

from sagas.actions import (
    ask_agent,
    claim_turn,
    consume_steering,
    end_turn,
    park_on_request,
    reply_to_request,
    saga_transaction,
)
from sagas.models import AgentRequest, Run, SteeringItem
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import Team, forget_queued_turns, queued_turns
from tests.support import wait_until

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite rings after commit"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_passwords"),
]


def resting(team: Team, name: str) -> Run:
    """The agent's run after a first turn that came to rest: idle, rung by new steering."""
    run = claim_turn(run_id=team.run(name).pk)
    assert run is not None and end_turn(run=run, turn=1, more=False) == Run.Status.IDLE
    return run


def ask(team: Team, sender: str, to: str) -> AgentRequest:
    request, _ = ask_agent(sender=team[sender], to=f"agent:{to}", type="ping", payload={"n": 1})
    return request


def claim(run_id: str) -> Run | None:
    """The claim of the worker the doorbell brings, on a connection of its own."""
    try:
        return claim_turn(run_id=run_id, worker="w2@host")
    finally:
        connection.close()


def waiting_on_a_lock() -> bool:
    """Whether another connection to this database waits for a lock (the claim, for the saga's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else this transaction sees its first read again
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return bool(cursor.fetchone()[0])


def rung_inside(team: Team, redis_url: str, run: Run, write: Callable[[], Any], *, commit: bool = True) -> Any:
    """Run `write` in a transaction that holds the saga's lock, as a turn's does; check that the
    run is rung before the commit and that a claim then waits for the transaction; return what
    `write` returned and the claim's outcome."""
    forget_queued_turns(redis_url)
    with ThreadPoolExecutor(max_workers=1) as pool:  # outlives the transaction the claim waits for
        with saga_transaction(team.saga):
            written = write()
            assert queued_turns(redis_url) == [run.pk]  # rung, the transaction still open
            claimed = pool.submit(claim, run.pk)
            wait_until(waiting_on_a_lock, what="the claim to wait for the saga's lock")
            assert not claimed.done()
            if not commit:
                transaction.set_rollback(True)
        return written, claimed.result(timeout=30)


def test_an_ask_rings_the_idle_recipient_before_its_commit_and_the_claim_reads_the_request(
    make_team: MakeTeam, redis_url: str
) -> None:
    team = make_team(internal=["coder"])
    coder = resting(team, "coder")

    request, claimed = rung_inside(team, redis_url, coder, lambda: ask(team, "lead", "coder"))

    assert claimed is not None and (claimed.status, claimed.turn, claimed.worker) == ("running", 2, "w2@host")
    assert [i.request_id for i in consume_steering(recipient=team["coder"], turn=2)] == [request.pk]
    assert queued_turns(redis_url) == [coder.pk]  # and not rung a second time after the commit


def test_a_reply_in_a_turn_rings_the_idle_asker_before_its_commit(make_team: MakeTeam, redis_url: str) -> None:
    team = make_team(internal=["lead"])
    lead = resting(team, "lead")
    request = ask(team, "lead", "coder")
    forget_queued_turns(redis_url)

    _, claimed = rung_inside(
        team, redis_url, lead, lambda: reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"ok": 1})
    )

    assert claimed is not None and claimed.turn == 2
    (response,) = consume_steering(recipient=team["lead"], turn=2)
    assert (response.kind, response.request_id, response.payload) == (SteeringItem.Kind.RESPONSE, request.pk, {"ok": 1})


def test_a_reply_in_a_turn_rings_the_asker_parked_on_it_before_its_commit_and_once(
    make_team: MakeTeam, redis_url: str
) -> None:
    team = make_team(internal=["lead"])
    lead = claim_turn(run_id=team.run("lead").pk)
    assert lead is not None
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={"n": 1}, mode="wait")
    park_on_request(run=lead, turn=1, request_id=request.pk, tool_call_id="call-1")
    assert end_turn(run=lead, turn=1, more=False) == Run.Status.WAITING

    _, claimed = rung_inside(
        team, redis_url, lead, lambda: reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"ok": 1})
    )

    assert claimed is not None and (claimed.turn, claimed.waiting_on_id) == (2, request.pk)
    assert queued_turns(redis_url) == [lead.pk]  # and not rung a second time after the commit


def test_a_doorbell_rung_before_a_rollback_finds_nothing_to_claim(make_team: MakeTeam, redis_url: str) -> None:
    team = make_team(internal=["coder"])
    coder = resting(team, "coder")

    _, claimed = rung_inside(team, redis_url, coder, lambda: ask(team, "lead", "coder"), commit=False)

    assert claimed is None
    assert (team.run("coder").status, team.run("coder").turn) == (Run.Status.IDLE, 1)
    assert not AgentRequest.objects.filter(saga=team.saga).exists()


def test_without_the_saga_lock_granted_the_doorbell_waits_for_the_commit(make_team: MakeTeam, redis_url: str) -> None:
    team = make_team(internal=["coder"])
    coder = resting(team, "coder")
    forget_queued_turns(redis_url)

    with transaction.atomic():  # as an API call's ask: its own lock, not a turn's held one
        ask(team, "lead", "coder")
        assert queued_turns(redis_url) == []
    assert queued_turns(redis_url) == [coder.pk]
