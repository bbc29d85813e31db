"""What the benchmarks that time reads as a history grows share (bench/ask_history.py,
bench/team_tokens.py): the command line, one child process per database (settings are read from
the environment once), on SQLite in a temporary data dir and, when it answers, on PostgreSQL at
postgres://postgres@127.0.0.1:5432 in a temporary database that is dropped afterwards, and the
table of medians, each with its ratio to the read with no history."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.journal_append import BASE_DIR, postgres_database

Measure = Callable[[list[int], int], dict[str, Any]]  # (history sizes, calls) -> {"vendor", "sizes"}


def analyze() -> None:
    """On PostgreSQL, fresh statistics for the history just grown, as autovacuum would keep them
    (SQLite plans by its own rules, unanalyzed, as Agora leaves it)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def median_us(read: Callable[[], object], calls: int) -> float:
    """The median of `calls` timings of `read`, in microseconds."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        read()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def main(script: str, doc: str, measure: Measure, *, history: str, what: str, reads: dict[str, str]) -> None:
    """`script`: the benchmark's file, run again as the child that calls `measure`; `history`: what
    grows (the sizes' column); `what`: what one read is; `reads`: each read's key and column."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--history", default="0,2000,20000", help=f"{history}, comma-separated")
    parser.add_argument("--calls", type=int, default=300, help="reads timed per size")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.history.split(",")})
    if args.child:
        print(json.dumps(measure(sizes, args.calls)))
        return

    def report(database_url: str | None) -> None:
        with tempfile.TemporaryDirectory() as data_dir:
            env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
            env.update(AGORA_DATA_DIR=data_dir, DJANGO_SETTINGS_MODULE="config.settings", LOG_LEVEL="WARNING")
            if database_url:
                env["DATABASE_URL"] = database_url
            argv = [sys.executable, script, "--child", "--history", args.history, "--calls", str(args.calls)]
            done = subprocess.run(argv, env=env, cwd=BASE_DIR, capture_output=True, text=True, check=True)
        results = json.loads(done.stdout.strip().splitlines()[-1])
        by_size = results["sizes"]
        base = by_size[min(by_size, key=int)]
        print(f"\n{results['vendor']}: median per {what}, µs (ratio to no history)")
        print(f"  {history:>18}" + "".join(f" {label:>16}" for label in reads.values()))
        for size, cell in by_size.items():
            print(f"  {int(size):>18,}" + "".join(f" {cell[k]:>8.0f} ({cell[k] / base[k]:4.1f}x)" for k in reads))

    report(None)
    with postgres_database() as url:
        if url is None:
            print("\nPostgreSQL does not answer at 127.0.0.1:5432: skipped")
        else:
            report(url)
