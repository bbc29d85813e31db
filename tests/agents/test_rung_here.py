"""A task takes the runs its turns rang, within its time slice, rather than leave each to its
doorbell's trip through the broker (executor.run_turn, sagas.wakeups.rung_here). The doorbells
still go: one delivered after finds its run taken, and nothing runs twice."""

import pytest
from django.conf import LazySettings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.executor import run_turn
from journal.models import JournalEvent
from sagas.models import Collaborator, Run, Saga
from sagas.wakeups import ring_run, rung_here
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.sagas.kernel import AddAgent, forget_queued_turns, queued_turns

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pair(model_here: FakeLLM, add_internal: AddAgent, redis_url: str) -> tuple[Collaborator, Collaborator]:
    """echo, idle after its first turn, and ann, queued, whose first turn asks echo and rests;
    her next turn, which the reply rings, finishes."""
    echo = add_internal("echo", model="scripted:responder")
    run_turn(echo.run.pk)  # its handoff: the turns it rang (none) are tried too
    model_here.script(
        "model-a",
        say("", tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": {"n": 1}}, "c1")),
        say("Waiting for echo."),
        say("", tool_call("finish", {"result": "done"}, "c2")),
    )
    ann = add_internal("ann", model="model-a")
    forget_queued_turns(redis_url)  # ann's doorbell, which the test delivers by hand
    return echo, ann


def turns_of(collaborator: Collaborator) -> int:
    return Run.objects.get(collaborator=collaborator).turn


def test_the_runs_a_task_rang_run_in_it_and_their_doorbells_find_them_taken(
    pair: tuple[Collaborator, Collaborator], model_here: FakeLLM, saga: Saga, redis_url: str, settings: LazySettings
) -> None:
    echo, ann = pair
    settings.AGORA_TURN_SLICE_S = 60  # time enough for all of it, however slow the machine

    run_turn(ann.run.pk)  # ann asks, echo (rung) replies, ann (rung back) finishes: one task

    assert Run.objects.get(collaborator=ann).status == Run.Status.COMPLETED
    assert Run.objects.get(collaborator=echo).status == Run.Status.IDLE
    assert "echo.me" in str(model_here.calls_for("model-a")[2]["messages"])  # the reply, taken in by her last turn
    # Every doorbell went all the same; delivered now, each finds its run taken and runs nothing.
    doorbells = queued_turns(redis_url)
    assert sorted(doorbells) == sorted([str(echo.run.pk), str(ann.run.pk)])
    turns, events = (turns_of(echo), turns_of(ann)), JournalEvent.objects.filter(saga=saga).count()
    for run_id in doorbells:
        run_turn(run_id)
    assert (turns_of(echo), turns_of(ann)) == turns
    assert JournalEvent.objects.filter(saga=saga).count() == events
    assert len(model_here.calls_for("model-a")) == 3


def test_past_its_time_slice_a_task_leaves_the_runs_it_rang_to_their_doorbells(
    pair: tuple[Collaborator, Collaborator], model_here: FakeLLM, redis_url: str, settings: LazySettings
) -> None:
    echo, ann = pair
    settings.AGORA_TURN_SLICE_S = 0

    run_turn(ann.run.pk)  # her ask rings echo; her own slice is used up too: she goes back in line

    assert (Run.objects.get(collaborator=echo).status, turns_of(echo)) == (Run.Status.QUEUED, 1)
    assert sorted(queued_turns(redis_url)) == sorted([str(echo.run.pk), str(ann.run.pk)])
    settings.AGORA_TURN_SLICE_S = 60
    for run_id in queued_turns(redis_url):  # the doorbells do the rest
        run_turn(run_id)
    assert Run.objects.get(collaborator=ann).status == Run.Status.COMPLETED
    assert Run.objects.get(collaborator=echo).status == Run.Status.IDLE


def test_rung_here_collects_each_run_once_in_order_and_only_inside_its_block(redis_url: str) -> None:
    ring_run("outside")
    with rung_here() as rung:
        for run_id in ("b", "a", "b"):
            ring_run(run_id)
        with rung_here() as inner:  # a task inside a task (eager calls): each its own
            ring_run("c")
        assert rung == ["b", "a"] and inner == ["c"]
    ring_run("after")
    assert rung == ["b", "a"]
    assert sorted(queued_turns(redis_url)) == ["a", "after", "b", "b", "c", "outside"]  # every doorbell goes


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's one write lock")
def test_on_sqlite_a_doorbell_for_a_run_not_queued_takes_no_write_lock(pair: tuple[Collaborator, Collaborator]) -> None:
    echo, _ = pair  # idle: its doorbell came after another task took its turn

    with CaptureQueriesContext(connection) as queries:
        run_turn(echo.run.pk)

    # One read, no transaction: neither BEGIN IMMEDIATE nor the claim's UPDATE.
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["SELECT"]
    assert turns_of(echo) == 1
