"""The stack the ask_agent benchmarks drive (bench/ask_agent_rtt.py, bench/capacity.py): the
environment this process and its workers share, the scripted playbooks and the profiles of agents A
and B, `celery worker` processes started and stopped here, and the client that adds A/B pairs and
reads their round trips from what the workers wrote to the database.

Django is set up by the script that imports this, after `configure`: what needs it is imported
where it is used."""

import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import stop_process, wait_until

BASE_DIR = Path(__file__).resolve().parent.parent

AGORA_DB = 0  # Redis database numbers on the one server: Agora's broker, channel layer, wake-ups
BARE_DB = 1  # the bare Celery app's broker and reply lists
PAYLOAD = {"question": "ping", "detail": "x" * 64}


# --- setup ---------------------------------------------------------------------------------------


def configure(workdir: Path, redis_base: str, database_url: str) -> None:
    """The environment this process and its workers share; read once, when Django starts."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        AGORA_DATA_DIR=str(workdir),
        DATABASE_URL=database_url,
        REDIS_URL=f"{redis_base}/{AGORA_DB}",
        BENCH_BARE_REDIS_URL=f"{redis_base}/{BARE_DB}",
        AGORA_PLAYBOOK_DIRS=str(workdir / "playbooks"),
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )


def write_playbooks(folder: Path, asks: int, mode: str = "async") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    responder = {"replies": {"bench.ping": {"pong": True}}}
    (folder / "bench-responder.json").write_text(json.dumps(responder))
    for name, n in (("bench-asker-1", 1), ("bench-asker-n", asks)):
        steps = [
            {"tool": "ask_agent", "args": {"to": "agent:b", "type": "bench.ping", "mode": mode,
                                           "payload": {**PAYLOAD, "n": i}}}
            for i in range(n)
        ]  # fmt: skip
        (folder / f"{name}.json").write_text(json.dumps({"steps": steps, "idle_text": "Waiting for replies."}))


PROFILES = [
    {"name": "bench-responder", "role": "Responder", "system_prompt": "Answer pings.", "tools": ["reply"],
     "model": "scripted:bench-responder", "max_turns": 1_000_000},
    {"name": "bench-asker-1", "role": "Asker", "system_prompt": "Ask B once.", "tools": ["ask_agent"],
     "model": "scripted:bench-asker-1", "max_turns": 1_000_000},
    {"name": "bench-asker-n", "role": "Asker", "system_prompt": "Ask B many times.", "tools": ["ask_agent"],
     "model": "scripted:bench-asker-n", "max_turns": 1_000_000},
]  # fmt: skip


class Worker:
    """One `celery worker -P prefork -c N` process group, started here and killed at the end."""

    def __init__(self, app: str, concurrency: int, logdir: Path, ping: Callable[[str], bool]) -> None:
        self.name = f"bench-{uuid.uuid4().hex[:8]}@localhost"
        self.log_path = logdir / f"{app.replace('.', '-')}-c{concurrency}.log"
        argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-n", self.name, "-l", "WARNING",
                "-P", "prefork", "-c", str(concurrency), "--without-mingle", "--without-gossip"]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=BASE_DIR, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_until(lambda: self.alive() and ping(self.name), timeout=60, interval=0.2, what=f"worker {app}")
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited early:\n{self.log_path.read_text(errors='replace')}")
        return True

    def stop(self) -> None:
        stop_process(self.proc, grace=5)


@contextmanager
def workers(concurrency: int, logdir: Path, bare_app: Any) -> Iterator[None]:
    from config.celery import app as agora_app

    started: list[Worker] = []
    try:
        started.append(Worker("config", concurrency, logdir, lambda n: bool(agora_app.control.ping([n], timeout=0.3))))
        started.append(
            Worker("bench.bare_celery", concurrency, logdir, lambda n: bool(bare_app.control.ping([n], timeout=0.3)))
        )
        yield
    finally:
        for worker in started:
            worker.stop()


# --- the machine and the rate ---------------------------------------------------------------------


def sustained_rate(started: float, done_at: list[float]) -> float:
    """Completions per second over the whole batch, from the first send to the last completion.
    (Replies reach a turn in batches, many at one instant: a window over part of the completions
    would overstate the rate.)"""
    return len(done_at) / (max(done_at) - started)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- Agora --------------------------------------------------------------------------------------


class Agora:
    def __init__(self, mode: str = "async") -> None:
        from accounts.models import User

        self.mode = mode
        self.owner = User.objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
        self.sagas = 0

    def saga(self) -> Any:
        from sagas.actions import create_saga

        self.sagas += 1
        return create_saga(title=f"bench {self.sagas}", owner=self.owner)

    def add(self, saga: Any, name: str, profile: str) -> Any:
        from sagas.actions import add_agent

        collaborator, _ = add_agent(
            saga=saga, name=name, role=profile, task="Benchmark.", runtime="internal", profile=profile, by=self.owner
        )
        return collaborator

    def round_trip(self) -> float:
        """One ask_agent round trip with nothing else in flight; milliseconds."""
        from sagas.models import Run

        saga = self.saga()
        b = self.add(saga, "b", "bench-responder")
        wait_until(lambda: Run.objects.filter(collaborator=b, status=Run.Status.IDLE).exists(), interval=0.01)
        a = self.add(saga, "a", "bench-asker-1")
        # The round trip is read from the timestamps the workers wrote, so polling faster measures
        # nothing sooner; its queries would only compete for the CPU and the database with the
        # round trip they wait for (the bare baseline's client blocks on a Redis list instead).
        answered = wait_until(lambda: self.taken_in([a]), interval=0.05, what="the reply to reach A's turn")
        ((created, taken),) = answered
        return (taken - created) * 1000

    def throughput(self, pairs: int, asks: int) -> tuple[float, list[float], float]:
        """P pairs asking N times each, all at once: (round trips/s, their latencies in ms, turns per round trip)."""
        from django.db import transaction
        from django.db.models import Sum

        from sagas.models import Run

        with transaction.atomic():  # every pair starts at commit
            sagas = [self.saga() for _ in range(pairs)]
            askers = []
            for saga in sagas:
                self.add(saga, "b", "bench-responder")
                askers.append(self.add(saga, "a", "bench-asker-n"))
        total = pairs * asks

        def all_taken_in() -> list[tuple[float, float]] | None:
            rows = self.taken_in(askers)
            return rows if len(rows) >= total else None

        rows = wait_until(all_taken_in, timeout=600, interval=0.1, what=f"{total} round trips")
        turns = Run.objects.filter(collaborator__saga__in=sagas).aggregate(t=Sum("turn"))["t"]
        latencies = [(consumed - created) * 1000 for created, consumed in rows]
        first_ask = min(created for created, _ in rows)
        return sustained_rate(first_ask, [consumed for _, consumed in rows]), latencies, turns / total

    def taken_in(self, askers: list[Any]) -> list[tuple[float, float]]:
        """(the request's created_at, when its asker took the reply in) of each reply taken in, in
        seconds: its response's `consumed_at` (async), or its tool result's transcript entry (wait)."""
        from agents.models import TranscriptEntry
        from sagas.models import AgentRequest, SteeringItem

        if self.mode == "async":
            answered = SteeringItem.objects.filter(
                recipient__in=askers, kind=SteeringItem.Kind.RESPONSE, consumed_at__isnull=False
            ).values_list("request__created_at", "consumed_at")
            return [(created.timestamp(), consumed.timestamp()) for created, consumed in answered if consumed]
        results = TranscriptEntry.objects.filter(run__collaborator__in=askers, message__role="tool")
        asked = dict(AgentRequest.objects.filter(sender__in=askers).values_list("id", "created_at"))
        return [
            (asked[json.loads(message["content"])["request_id"]].timestamp(), at.timestamp())
            for message, at in results.values_list("message", "created_at")
        ]
