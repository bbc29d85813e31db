"""The kernel's metrics, counted in this process and read through `/metrics` (no multiprocess
directory: the test process's own counts). Counters only grow, so each test compares a scrape
after with one before."""

from typing import Any

import pytest
from django.conf import LazySettings
from django.db import transaction
from django.test import Client

from sagas.actions import ask_agent, claim_turn, consume_steering, reply_to_request
from sagas.models import Run
from sagas.tasks import reconcile
from tests.sagas.conftest import MakeTeam
from tests.sagas.kernel import Clock, Team
from tests.scrape import TOKEN, buckets, family, scrape, value

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]

RTT = "agora_round_trip_seconds"


@pytest.fixture(autouse=True)
def this_process(settings: LazySettings) -> None:
    settings.PROMETHEUS_MULTIPROC_DIR = ""
    settings.AGORA_METRICS_TOKEN = TOKEN


def test_a_round_trip_ends_when_the_sender_takes_the_reply_in(
    team: Team, clock: Clock, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    before = scrape(client)
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={"q": 1})
    clock.advance(3)
    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"a": 1})
    clock.advance(1)
    assert family(scrape(client), RTT) == family(before, RTT)  # replied, but not yet taken in

    with django_capture_on_commit_callbacks(execute=True):  # counted once its transaction commits
        consume_steering(recipient=team["lead"])  # the sender reads its steering: the reply is in

    after = scrape(client)
    done = {"status": "completed"}
    assert (
        value(after, "agora_round_trip_seconds_count", done)
        == value(before, "agora_round_trip_seconds_count", done) + 1
    )
    assert value(after, f"{RTT}_sum", done) == pytest.approx(value(before, f"{RTT}_sum", done) + 4.0)
    grew = {le for le, n in buckets(after, RTT, done).items()
            if n > buckets(before, RTT, done).get(le, 0)}  # fmt: skip
    assert grew == {"5.0", "10.0", "30.0", "60.0", "300.0", "1800.0", "+Inf"}  # 4 s: not in le=2.5

    with django_capture_on_commit_callbacks(execute=True):
        consume_steering(recipient=team["lead"])  # nothing new
    assert value(scrape(client), "agora_round_trip_seconds_count", done) == value(
        after, "agora_round_trip_seconds_count", done
    )


def test_a_consumption_that_rolls_back_counts_nothing(
    team: Team, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    request, _ = ask_agent(sender=team["lead"], to="agent:coder", type="ping", payload={"q": 1})
    reply_to_request(request_id=request.pk, by=team.user("coder"), payload={"a": 1})
    before = scrape(client)

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        assert consume_steering(recipient=team["lead"])
        raise RuntimeError("the turn failed before it committed")

    assert family(scrape(client), RTT) == family(before, RTT)


def test_lease_reclaims_and_rerung_runs_are_counted_by_the_reconciler(
    make_team: MakeTeam, clock: Clock, redis_url: str, settings: LazySettings, client: Client
) -> None:
    team = make_team(internal=["coder"])
    assert claim_turn(run_id=team.run("coder").pk) is not None
    before = scrape(client)
    clock.advance(settings.AGORA_LEASE_S + 1)  # the worker died: nobody renewed the lease

    assert reconcile()["runs_rung"] == 1

    after = scrape(client)
    assert value(after, "agora_lease_reclaims_total") == value(before, "agora_lease_reclaims_total") + 1
    assert value(after, "agora_wakeups_rerung_total") == value(before, "agora_wakeups_rerung_total") + 1


def test_runs_by_status_are_read_from_the_database_at_scrape_time(
    make_team: MakeTeam, client: Client, django_assert_num_queries
) -> None:
    team = make_team(internal=["coder", "tester"])
    assert claim_turn(run_id=team.run("coder").pk) is not None

    with django_assert_num_queries(1):  # one aggregate, whatever the number of runs
        samples = scrape(client)

    for status in Run.Status.values:
        expected = Run.objects.filter(status=status).count()
        assert value(samples, "agora_runs", {"status": status}, default=-1) == expected, status
    assert value(samples, "agora_runs", {"status": "running"}) == 1
