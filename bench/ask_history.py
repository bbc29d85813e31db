"""What an ask's read and a run's ending cost as an agent's history of answered requests grows.

    .venv/bin/python bench/ask_history.py [--history 0,2000,20000] [--calls 300]

Every `ask_agent` reads, in one statement (`sagas.actions.requests.read_ask`), how many requests its
sender has open, the deepest hop among those its recipient has open, and whether the idempotency
key was used; a run that ends reads the requests still open to it (`_STRANDED_SQL`). Both should
cost the same whatever the agents sent and answered before. Here agent A has sent agent B a
growing number of answered requests (and three still open), PostgreSQL's statistics are
fresh (ANALYZE, as autovacuum keeps them; Agora never analyzes SQLite, whose planner then goes by
its rules), and each read is timed `--calls` times as the hot path runs it (on PostgreSQL a
prepared statement with its generic plan, config/postgresql/base.py). Printed: the median per
history size, and its ratio to the read with no history, measured in the same run.

Runs on SQLite (a temporary data dir) and, when it answers, on PostgreSQL at
postgres://postgres@127.0.0.1:5432 in a temporary database that is dropped afterwards; each in a
child process, since settings are read from the environment once.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.journal_append import postgres_database  # noqa: E402

OPEN = 3  # of A's requests to B, the first few are still open; the rest answered


def measure(sizes: list[int], calls: int) -> dict[str, Any]:
    """In the child: the medians, in microseconds, per history size."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from accounts.models import User
    from config.sql import fetch
    from sagas.actions import add_agent, create_saga
    from sagas.actions.requests import read_ask
    from sagas.actions.runs import _STRANDED_SQL
    from sagas.models import AgentRequest, Collaborator

    call_command("migrate", verbosity=0)
    owner = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    saga = create_saga(title="Ask history", owner=owner)
    for name in ("a", "b"):
        add_agent(saga=saga, name=name, role="r", task="t", runtime="external", by=owner)
    a, b = (Collaborator.objects.get(saga=saga, name=name) for name in ("a", "b"))

    def timed(read: Any) -> float:
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            read()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1e6

    def requests(n: int, status: str) -> None:
        now = timezone.now()
        fields = {"saga": saga, "sender": a, "recipient": b, "type": "t", "payload": {}, "reply": {}}
        AgentRequest.objects.bulk_create(
            [AgentRequest(**fields, expires_at=now, status=status) for _ in range(n)], batch_size=2000
        )

    results: dict[str, Any] = {"vendor": connection.vendor, "sizes": {}}
    requests(OPEN, "pending")
    made = 0
    for size in sizes:
        requests(size - made, "completed")
        made = size
        if connection.vendor == "postgresql":  # as autovacuum would; SQLite plans by its rules, unanalyzed
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        results["sizes"][size] = {
            "ask": timed(lambda: read_ask(saga, a, "b")),
            "ending": timed(lambda: fetch(_STRANDED_SQL, [b.pk], AgentRequest, Collaborator, Collaborator)),
        }
    return results


def run_child(database_url: str | None, sizes: list[int], calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data_dir:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(AGORA_DATA_DIR=data_dir, DJANGO_SETTINGS_MODULE="config.settings", LOG_LEVEL="WARNING")
        if database_url:
            env["DATABASE_URL"] = database_url
        argv = [sys.executable, __file__, "--child", "--history", ",".join(map(str, sizes)), "--calls", str(calls)]
        done = subprocess.run(argv, env=env, cwd=BASE_DIR, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict[str, Any]) -> None:
    sizes = results["sizes"]
    base = sizes[min(sizes, key=int)]
    print(f"\n{results['vendor']}: median per read, µs (ratio to no history)")
    print(f"  {'answered requests':>18} {'ask read':>16} {'ending read':>16}")
    for size, cell in sizes.items():
        print(
            f"  {int(size):>18,} {cell['ask']:>8.0f} ({cell['ask'] / base['ask']:4.1f}x)"
            f" {cell['ending']:>8.0f} ({cell['ending'] / base['ending']:4.1f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="0,2000,20000", help="answered requests from A to B, comma-separated")
    parser.add_argument("--calls", type=int, default=300, help="reads timed per size")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.history.split(",")})
    if args.child:
        print(json.dumps(measure(sizes, args.calls)))
        return
    report(run_child(None, sizes, args.calls))
    with postgres_database() as url:
        if url is None:
            print("\nPostgreSQL does not answer at 127.0.0.1:5432: skipped")
        else:
            report(run_child(url, sizes, args.calls))


if __name__ == "__main__":
    main()
