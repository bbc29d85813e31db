"""Failover: how long a dead host's turn waits before a live worker takes it over.

    .venv/bin/python bench/failover.py [--kills K] [--postgres]

Two Celery workers (`-c 2` each) and one `celery beat`, at production's lease and reconcile
interval (AGORA_LEASE_S, AGORA_RECONCILE_INTERVAL_S: their defaults unless set). For each kill an
internal agent's model call hangs on a local OpenAI-compatible server (tests/agents/fake_llm.py);
the worker holding the run (the run's `worker` column) is killed with SIGKILL, whole process group,
as when its host dies. Takeover is the time from the kill to the live worker's model call for the
same turn; it is printed with the time to the `run.reclaimed` event, then the killed worker is
started again for the next kill. Median, min and max over the kills are printed.

It needs nothing running: a temporary data dir with its own SQLite database (or a temporary
PostgreSQL database), the embedded redis-server on a free port, and its own processes, all removed
at the end. Settings are production's (DEBUG=0).
"""

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.journal_append import PG_SERVER, postgres_database  # noqa: E402
from tests.agents.fake_llm import HANG, FakeLLM, say, tool_call  # noqa: E402
from tests.support import CeleryBeat, CeleryWorker, RedisServer, wait_until  # noqa: E402


def one_kill(kill: int, fake: FakeLLM, workers: dict[str, CeleryWorker], owner: Any) -> tuple[float, float]:
    """Kill the worker in the middle of a model call; (takeover, reclaim) in seconds after the kill."""
    from journal.models import JournalEvent
    from sagas import actions
    from sagas.models import Run

    calls = len(fake.calls_for("slow-model"))
    fake.script("slow-model", HANG, say("", tool_call("finish", {"result": "ok"}, f"c{kill}")))
    saga = actions.create_saga(title=f"Failover {kill}", owner=owner)
    agent, _ = actions.add_agent(
        saga=saga, name="slow", role="Slow", task="Think slowly", runtime="internal", profile="slow", by=owner
    )
    wait_until(lambda: len(fake.calls_for("slow-model")) > calls, timeout=60, what="the model call")
    holder = Run.objects.get(collaborator=agent).worker
    wall_killed = time.time()
    workers[holder].kill()
    killed = time.monotonic()
    wait_until(lambda: len(fake.calls_for("slow-model")) > calls + 1, timeout=120, interval=0.01, what="the takeover")
    takeover = time.monotonic() - killed
    reclaim = JournalEvent.objects.get(saga=saga, type="run.reclaimed").created_at.timestamp() - wall_killed
    run = wait_until(lambda: Run.objects.filter(collaborator=agent, status=Run.Status.COMPLETED).first(), timeout=60)
    print(f"kill {kill}: {holder} killed; reclaimed after {reclaim:.2f} s, taken over after {takeover:.2f} s "
          f"by {run.worker}", flush=True)  # fmt: skip
    restarted = workers.pop(holder)
    restarted.start()  # back for the next kill, under a new name
    workers[restarted.name] = restarted
    return takeover, reclaim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--postgres", action="store_true", help=f"a temporary database on {PG_SERVER}")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-failover-"))
    cleanup = ExitStack()
    redis = RedisServer(workdir / "redis")
    cleanup.callback(redis.stop)
    fake = FakeLLM()
    cleanup.callback(fake.stop)
    try:
        database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
        if args.postgres:
            database_url = cleanup.enter_context(postgres_database()) or ""
            if not database_url:
                raise SystemExit(f"PostgreSQL at {PG_SERVER} does not answer")
        redis_url = f"{redis.base_url}/0"
        os.environ.update(
            DJANGO_SETTINGS_MODULE="config.settings", AGORA_DATA_DIR=str(workdir), DATABASE_URL=database_url,
            REDIS_URL=redis_url, DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), LOG_LEVEL="WARNING",
            OPENAI_BASE_URL=fake.url, OPENAI_API_KEY="bench", OPENAI_TIMEOUT_S="120",
        )  # fmt: skip
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        from accounts.models import User
        from agents.actions import load_profiles

        call_command("migrate", verbosity=0)
        load_profiles(entries=[{"name": "slow", "role": "Slow", "model": "slow-model", "tools": ["finish"]}])
        owner = User.objects.create_user(username="bench-owner")
        workers = {}
        for _ in range(2):
            worker = CeleryWorker(redis_url, workdir)
            workers[worker.name] = worker
            cleanup.callback(worker.kill)
        beat = CeleryBeat(redis_url, workdir)
        cleanup.callback(beat.stop)
        print(
            f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; "
            f"{'PostgreSQL' if args.postgres else 'SQLite (WAL)'}; lease {settings.AGORA_LEASE_S:g} s, "
            f"reconcile every {settings.RECONCILE_INTERVAL_S:g} s",
            flush=True,
        )

        takeovers: list[float] = []
        reclaims: list[float] = []
        for kill in range(1, args.kills + 1):
            takeover, reclaim = one_kill(kill, fake, workers, owner)
            takeovers.append(takeover)
            reclaims.append(reclaim)

        print(
            f"\ntakeover over {len(takeovers)} kills: median {statistics.median(takeovers):.2f} s "
            f"(min {min(takeovers):.2f}, max {max(takeovers):.2f}); reclaim median "
            f"{statistics.median(reclaims):.2f} s"
        )
    finally:
        cleanup.close()


if __name__ == "__main__":
    main()
