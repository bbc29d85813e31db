"""Helpers for the kernel's tests: reading the journal, steering and the broker queue, running calls
concurrently, and a fake clock. Every write still goes through `sagas.actions`."""

import base64
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from redis import Redis

from accounts.models import User
from agents.models import AgentProfile
from journal.models import JournalEvent
from sagas import errors
from sagas.models import AgentRequest, Collaborator, Run, Saga, SteeringItem
from sagas.wakeups import RUN_TURN_TASK

T = TypeVar("T")
AddAgent = Callable[..., Collaborator]  # tests/agents/conftest.py's add_internal

# The saga tree most tests use (name, delegator; None hangs the agent under the saga's owner):
#
#   human:alice (owner)          human:bob (a collaborator, not a manager)
#   ├── agent:lead
#   │   ├── agent:coder
#   │   │   └── agent:tester
#   │   └── agent:reviewer
#   └── agent:scout
TREE: list[tuple[str, str | None]] = [
    ("lead", None),
    ("scout", None),
    ("coder", "lead"),
    ("reviewer", "lead"),
    ("tester", "coder"),
]
AGENTS = [name for name, _ in TREE]


@dataclass
class Team:
    """A saga and its cast. Lookups re-read the database, so tests never hold stale rows."""

    saga: Saga
    names: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Collaborator:
        return Collaborator.objects.select_related("run", "user", "saga").get(saga=self.saga, name=name)

    def run(self, name: str) -> Run:
        return Run.objects.get(collaborator__saga=self.saga, collaborator__name=name)

    def user(self, name: str) -> User:
        return self[name].user


def profile_named(name: str) -> str:
    """An agent profile of that name (a scripted responder unless one exists), for internal agents
    whose turns the test runs itself or never runs."""
    AgentProfile.objects.get_or_create(
        name=name, defaults={"role": name.title(), "model": "scripted:responder", "tools": ["reply", "finish"]}
    )
    return name


def last_seq(saga: Saga) -> int:
    return JournalEvent.objects.filter(saga=saga).count()


def journal(saga: Saga, *, after: int = 0) -> list[tuple[str, str]]:
    """(type, actor) of the saga's events after `after`, in seq order; the seqs must be gap-free."""
    events = list(JournalEvent.objects.for_saga(saga.pk))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "the journal's seq has a gap"
    return [(e.type, e.actor) for e in events if e.seq > after]


def finished(collaborator: Collaborator) -> Run | None:
    """Its run once the run has reached a terminal status, else None (for wait_until)."""
    run = Run.objects.get(collaborator=collaborator)
    return run if run.is_finished else None


def events_of(saga: Saga, type: str) -> list[JournalEvent]:
    return list(JournalEvent.objects.for_saga(saga.pk).filter(type=type))


def steering(collaborator: Collaborator) -> list[SteeringItem]:
    return list(SteeringItem.objects.filter(recipient=collaborator).order_by("seq"))


def unread(collaborator: Collaborator) -> list[SteeringItem]:
    return [item for item in steering(collaborator) if item.consumed_at is None]


def kinds(collaborator: Collaborator) -> list[tuple[str, str | None]]:
    """(kind, request_id) of each steering item, in seq order."""
    return [(item.kind, item.request_id) for item in steering(collaborator)]


def request_ids(saga: Saga) -> list[str]:
    return list(AgentRequest.objects.filter(saga=saga).values_list("pk", flat=True))


def queued_turns(redis_url: str) -> list[str]:
    """Run ids of the `run_turn` messages waiting in the broker's default queue (nothing consumes
    them unless a worker runs)."""
    run_ids = []
    with Redis.from_url(redis_url) as client:
        for raw in client.lrange("celery", 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] == RUN_TURN_TASK:
                args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
                run_ids.append(args[0])
    return run_ids


def forget_queued_turns(redis_url: str) -> None:
    """Empty the broker's default queue (a test's set-up may have rung turns that committed)."""
    with Redis.from_url(redis_url) as client:
        client.delete("celery")


def run_concurrently(*calls: Callable[[], T]) -> list[Future[T]]:
    """Start every call at the same instant, each in its own thread with its own database
    connection (closed at the end), and return their settled futures."""
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], T]) -> T:
        try:
            connection.ensure_connection()  # connect first, so that the calls themselves collide
            barrier.wait(timeout=30)
            return call()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(start, call) for call in calls]
    return futures


def field_errors(refused: pytest.ExceptionInfo[errors.KernelError]) -> dict[str, list[str]]:
    """The per-field errors an InvalidPayload carries."""
    problems = refused.value.extra["errors"]
    assert isinstance(problems, dict)
    return problems


def outcomes(futures: list[Future[Any]]) -> list[Any]:
    """Each future's result, or the exception it raised."""
    return [f.exception() or f.result() for f in futures]


class Clock:
    """A fake `django.utils.timezone.now` that only moves when told to."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def reads(captured: CaptureQueriesContext) -> list[str]:
    """The statements that read, of those run meanwhile, but for the saga's row lock. PostgreSQL
    gets some in one message with the next (config/postgresql/base.py): they are told apart here."""
    statements = (part for query in captured.captured_queries for part in written_out(query["sql"]).split("; "))
    return [s for s in statements if s.startswith("SELECT") and not s.endswith("FOR NO KEY UPDATE")]


def written_out(message: str) -> str:
    """A message sent to PostgreSQL with each EXECUTE of a statement prepared on this connection
    (config/postgresql/base.py) written out as that statement, and the PREPAREs left out."""
    texts = {name: query for query, name in (getattr(connection.connection, "agora_prepared", None) or {}).items()}
    parts = [part for part in message.split("; ") if not part.startswith("PREPARE ")]
    return re.sub(r"EXECUTE (agora_\d+)(\([^;]*\))?", lambda m: texts[m.group(1)], "; ".join(parts))
