"""The ask_agent round trip through the real stack, next to a bare Celery two-hop round trip.

    .venv/bin/python bench/ask_agent_rtt.py [--rounds R] [--trials T] [--pairs P] [--asks N] [--profile]
                                            [--mode async|wait] [--postgres]

Agent A asks agent B asynchronously (both internal, on the scripted provider), B's turn replies,
and the reply is injected into A's next turn. One round trip runs from the request's `created_at`
to the `consumed_at` of B's response in A's steering: both written by the worker processes to the
database. With `--mode wait`, A's ask parks its run until the reply, which its next turn takes in
as the tool call's result: the round trip then ends at that result's transcript entry
(`created_at`, written with that turn's first commit). Everything is real: Celery worker
processes, Redis, the SQLite database (WAL), kernel actions, the journal and its publishing to the
channel layer.

Per worker configuration (one `celery worker -P prefork`, `-c 1` then `-c 2`) and per round:
- latency, one round trip in flight: a fresh saga, B started and idle, then A added; A's first
  turn asks B once (playbook `bench-asker-1`);
- throughput: P sagas at once, each with an A whose playbook asks B N times, one ask per model
  call (`bench-asker-N`), so replies stream back while A keeps asking; round trips per second from
  the first ask to the last reply taken in;
- the bare baseline on the same Redis (another database number) with a worker of the same shape:
  `bench.hop1` → `bench.hop2` → Redis list (bench/bare_celery.py), one in flight for latency and
  P in flight for throughput. With one in flight, Agora's round trips are spread among the bare
  ones, so that each of both starts from idle workers and both see the machine at the same time.
Medians over the rounds are printed. Then, with the workers stopped, the runtime's own overhead
per turn: the turns of each task of an A/B pair (`--asks` asks) timed in this process, one run's
at a time (`agents.executor.run_one`: not the runs they rang, which a worker's task may take too),
minus the model calls' latency as their `llm_call` journal events record it, shared among the
task's turns that called the model; one pair per round, and the target reads the median of the
pairs' medians. The connection stays open between tasks, as in a worker.

It needs nothing running: it makes a temporary data dir with its own SQLite database, starts the
embedded redis-server on a free port and its worker processes, and kills them all at the end.
Settings are production's (DEBUG=0).
"""

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.ask_agent_stack import (  # noqa: E402
    PROFILES,
    Agora,
    configure,
    loadavg,
    sustained_rate,
    workers,
    write_playbooks,
)
from bench.journal_append import PG_SERVER, postgres_database  # noqa: E402
from tests.support import RedisServer  # noqa: E402

# --- statistics ----------------------------------------------------------------------------------


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


@dataclass
class Round:
    rtt_ms: list[float] = field(default_factory=list)
    bare_ms: list[float] = field(default_factory=list)
    rate: float = 0.0
    loaded_rtt_ms: list[float] = field(default_factory=list)
    turns_per_rtt: float = 0.0
    bare_rate: float = 0.0


# --- the bare baseline ---------------------------------------------------------------------------


class Bare:
    def __init__(self, url: str) -> None:
        from celery import Celery
        from redis import Redis

        # Not the current app: the kernel rings turns through `current_app`, which must stay Agora's.
        self.app = Celery("bench_bare_client", broker=url, set_as_current=False)
        self.app.conf.update(task_serializer="json", accept_content=["json"])
        self.redis = Redis.from_url(url)

    def send(self, reply_to: str, token: str) -> None:
        self.app.send_task("bench.hop1", args=[reply_to, token])

    def round_trip(self) -> float:
        reply_to = f"bench:reply:{uuid.uuid4().hex}"
        started = time.time()
        self.send(reply_to, "1")
        popped = self.redis.blpop([reply_to], timeout=30)
        assert popped is not None, "the bare two-hop did not come back"
        _, done = json.loads(popped[1])
        return float((done - started) * 1000)

    def throughput(self, in_flight: int, total: int) -> float:
        reply_to = f"bench:reply:{uuid.uuid4().hex}"
        sent, done_at, started = 0, list[float](), time.time()
        for _ in range(in_flight):
            self.send(reply_to, str(sent))
            sent += 1
        while len(done_at) < total:
            popped = self.redis.blpop([reply_to], timeout=30)
            assert popped is not None, "bare two-hops stopped coming back"
            done_at.append(json.loads(popped[1])[1])
            if sent < total:
                self.send(reply_to, str(sent))
                sent += 1
        return sustained_rate(started, done_at)


def one_at_a_time(agora: Agora, bare: Bare, trials: int, bare_trials: int) -> tuple[list[float], list[float]]:
    """The round trips with one in flight, Agora's spread among the bare ones, so that both see the
    machine as it is at the time (a ratio of two medians taken a minute apart moves with the VM)."""
    rtt_ms, bare_ms = [], []
    for i in range(bare_trials):
        bare_ms.append(bare.round_trip())
        if i * trials // bare_trials != (i + 1) * trials // bare_trials:
            rtt_ms.append(agora.round_trip())
    return rtt_ms, bare_ms


# --- the runtime's overhead per turn, in process ----------------------------------------------------


@dataclass
class Overhead:
    overhead_ms: list[float] = field(default_factory=list)
    turn_ms: list[float] = field(default_factory=list)
    model_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    queries: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    asks: int = 0  # round trips the pair made: the totals below divided by it are per round trip
    total_queries: int = 0
    total_commits: int = 0
    round_medians: list[float] = field(default_factory=list)  # the overhead's median, pair by pair


def pooled(pairs: list[Overhead]) -> Overhead:
    """The turns of several pairs as one; the target reads the median of the pairs' medians, which
    a slow stretch of the machine during one of them moves least."""
    total = Overhead(round_medians=[med(pair.overhead_ms) for pair in pairs])
    for pair in pairs:
        for name in ("overhead_ms", "turn_ms", "model_ms", "cpu_ms", "queries", "commits"):
            getattr(total, name).extend(getattr(pair, name))
        total.asks += pair.asks
        total.total_queries += pair.total_queries
        total.total_commits += pair.total_commits
    return total


def measure_overhead(agora: Agora, asks: int, profile: cProfile.Profile | None) -> Overhead:
    """Every turn of one A/B pair (A asks N times), run here one at a time with no worker around."""
    from django.db import DEFAULT_DB_ALIAS, connection, connections

    from agents import executor
    from journal.models import JournalEvent
    from sagas.models import Run

    saga = agora.saga()
    agora.add(saga, "b", "bench-responder")
    agora.add(saga, "a", "bench-asker-n")
    result = Overhead(asks=asks)
    count, commits = [0], [0]

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        count[0] += 1
        return execute(sql, params, many, context)

    wrapper = connections[DEFAULT_DB_ALIAS]
    commit = wrapper.commit

    def counting_commit() -> None:  # every transaction of a turn ends in one
        commits[0] += 1
        commit()

    wrapper.commit = counting_commit  # type: ignore[method-assign]
    with connection.execute_wrapper(counting):
        while queued := list(
            Run.objects.filter(collaborator__saga=saga, status=Run.Status.QUEUED).values_list("pk", flat=True)
        ):
            for run_id in queued:
                after = JournalEvent.objects.filter(saga=saga).order_by("-seq").values_list("seq", flat=True)[0]
                count[0] = commits[0] = 0
                if profile:
                    profile.enable()
                started, cpu = time.perf_counter(), time.process_time()
                executor.run_one(run_id)  # one run's turns (a task may take the runs they rang, too)
                elapsed = (time.perf_counter() - started) * 1000
                cpu = (time.process_time() - cpu) * 1000
                if profile:
                    profile.disable()
                queries, committed = count[0], commits[0]
                result.total_queries += queries
                result.total_commits += committed
                calls = JournalEvent.objects.filter(saga=saga, seq__gt=after, run_id=run_id, type="llm_call")
                latencies = [e.data["latency_ms"] for e in calls]
                # One task runs consecutive turns of its run: each turn that called the model is
                # charged an equal share of the task's time (turns without a model call included).
                n = len(latencies)
                for _ in range(n):
                    result.turn_ms.append(elapsed / n)
                    result.model_ms.append(sum(latencies) / n)
                    result.overhead_ms.append((elapsed - sum(latencies)) / n)
                    result.cpu_ms.append((cpu - sum(latencies)) / n)
                    result.queries.append(queries / n)
                    result.commits.append(committed / n)
    del wrapper.commit
    return result


@dataclass
class Wire:
    """What the in-process turns of one A/B pair sent to PostgreSQL, from libpq's protocol trace:
    a round trip ends with the server's ReadyForQuery, a statement (BEGIN, COMMIT and SAVEPOINT
    included) with its CommandComplete."""

    turns: int
    asks: int
    round_trips: int
    statements: int


def count_on_the_wire(agora: Agora, asks: int) -> Wire | None:
    from django.db import connection
    from psycopg import pq

    from agents import executor
    from journal.models import JournalEvent
    from sagas.models import Run

    if connection.vendor != "postgresql":
        return None
    saga = agora.saga()
    agora.add(saga, "b", "bench-responder")
    agora.add(saga, "a", "bench-asker-n")
    connection.ensure_connection()
    with tempfile.TemporaryFile() as trace:
        while queued := list(
            Run.objects.filter(collaborator__saga=saga, status=Run.Status.QUEUED).values_list("pk", flat=True)
        ):
            for run_id in queued:
                pgconn = connection.connection.pgconn
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
                try:
                    executor.run_one(run_id)
                finally:
                    pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    turns = JournalEvent.objects.filter(saga=saga, type="llm_call").count()
    trips = sum(1 for line in lines if line.startswith("B\t") and "\tReadyForQuery\t" in line)
    statements = sum(1 for line in lines if line.startswith("B\t") and "\tCommandComplete\t" in line)
    return Wire(turns=turns, asks=asks, round_trips=trips, statements=statements)


# --- the report ------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values)


def row(label: str, values: list[str]) -> None:
    print(f"  {label:<52}" + "".join(f"{v:>16}" for v in values))


def print_wire(wire: Wire | None) -> None:
    if wire is None:
        return
    print(f"sent to PostgreSQL by the in-process turns of another pair ({wire.turns} turns, {wire.asks} round trips):")
    row("round trips to the server per turn / per round trip", [f"{wire.round_trips / wire.turns:.1f}",
                                                                 f"{wire.round_trips / wire.asks:.1f}"])  # fmt: skip
    row("statements (BEGIN, COMMIT, SAVEPOINT included) per turn / round trip", [f"{wire.statements / wire.turns:.1f}",
                                                                  f"{wire.statements / wire.asks:.1f}"])  # fmt: skip


def print_overhead(overhead: Overhead) -> None:
    pairs = len(overhead.round_medians)
    print(f"runtime overhead per turn, in process, {pairs} pairs, {len(overhead.overhead_ms)} turns with a model call:")
    row("whole turn (run_one time / model calls): median ms", [f"{med(overhead.turn_ms):.2f}"])
    row("model call (llm_call latency_ms): median ms", [f"{med(overhead.model_ms):.2f}"])
    row("overhead (turn minus model call): median ms", [f"{med(overhead.overhead_ms):.2f}"])
    row("  its median, pair by pair", [" / ".join(f"{m:.2f}" for m in overhead.round_medians)])
    row("overhead: p95 ms", [f"{p95(overhead.overhead_ms):.2f}"])
    row("overhead in CPU time (all threads of the process): median ms", [f"{med(overhead.cpu_ms):.2f}"])
    row("SQL statements per turn (run through a cursor): median", [f"{med(overhead.queries):.0f}"])
    row("transactions (commits) per turn: median", [f"{med(overhead.commits):.1f}"])
    row(
        f"SQL statements (run through a cursor) per round trip ({overhead.asks} asks)",
        [f"{overhead.total_queries / overhead.asks:.1f}"],
    )
    row("transactions (commits) per round trip", [f"{overhead.total_commits / overhead.asks:.1f}"])


def print_table(
    args: argparse.Namespace, results: dict[int, list[Round]], overhead: Overhead, wire: Wire | None
) -> None:
    configs = sorted(results)
    print()
    if configs:
        print(f"ask_agent round trip: median of {args.rounds} rounds; each round {args.trials} one-at-a-time round")
        print(f"trips, {args.pairs} pairs x {args.asks} asks for throughput, and the bare two-hop on the same Redis")
        row("one worker process, prefork pool of", [f"-c {c}" for c in configs])
    s: dict[int, dict[str, float]] = {}
    for c in configs:
        rounds = results[c]
        s[c] = {
            "rtt": med([med(r.rtt_ms) for r in rounds]),
            "rtt95": med([p95(r.rtt_ms) for r in rounds]),
            "bare": med([med(r.bare_ms) for r in rounds]),
            "bare95": med([p95(r.bare_ms) for r in rounds]),
            "rate": med([r.rate for r in rounds]),
            "loaded": med([med(r.loaded_rtt_ms) for r in rounds]),
            "loaded95": med([p95(r.loaded_rtt_ms) for r in rounds]),
            "turns": med([r.turns_per_rtt for r in rounds]),
            "bare_rate": med([r.bare_rate for r in rounds]),
        }
    if configs:
        row("ask_agent round trip, 1 in flight: median ms", [f"{s[c]['rtt']:.1f}" for c in configs])
        row("ask_agent round trip, 1 in flight: p95 ms", [f"{s[c]['rtt95']:.1f}" for c in configs])
        row("bare Celery two-hop, 1 in flight: median ms", [f"{s[c]['bare']:.2f}" for c in configs])
        row("bare Celery two-hop, 1 in flight: p95 ms", [f"{s[c]['bare95']:.2f}" for c in configs])
        row("ratio of medians (target <= 5)", [f"{s[c]['rtt'] / s[c]['bare']:.1f}x" for c in configs])
        row("ask_agent round trips/s, sustained", [f"{s[c]['rate']:.0f}" for c in configs])
        row("  round trip under that load: median ms", [f"{s[c]['loaded']:.0f}" for c in configs])
        row("  round trip under that load: p95 ms", [f"{s[c]['loaded95']:.0f}" for c in configs])
        row("  turns per round trip (A's and B's)", [f"{s[c]['turns']:.2f}" for c in configs])
        row(f"bare two-hops/s, {args.pairs} in flight", [f"{s[c]['bare_rate']:.0f}" for c in configs])
        row("ratio of rates (bare / ask_agent)", [f"{s[c]['bare_rate'] / s[c]['rate']:.1f}x" for c in configs])
        print()
    print_overhead(overhead)
    print_wire(wire)
    print()
    overhead_ms = med(overhead.round_medians)
    checks = [
        (f"runtime overhead per turn <= 5 ms, median of the pairs' (aim 2): {overhead_ms:.2f} ms", overhead_ms <= 5)
    ]
    if configs:
        most = max(configs)
        ratios = " / ".join(f"{s[c]['rtt'] / s[c]['bare']:.1f}x (-c {c})" for c in configs)
        checks = [
            (
                f"round-trip median <= 5 x bare two-hop (aim 3x): {ratios}",
                all(s[c]["rtt"] <= 5 * s[c]["bare"] for c in configs),
            ),
            (
                f"round trips/s >= 200 with -c {most} on {os.cpu_count()} cores (aim 400): {s[most]['rate']:.0f}",
                s[most]["rate"] >= 200,
            ),
            *checks,
        ]
    print("targets:")
    for label, met in checks:
        print(f"  {'met    ' if met else 'NOT met'}  {label}")


# --- main --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=30, help="one-at-a-time round trips per round")
    parser.add_argument("--pairs", type=int, default=8, help="A/B pairs at once for throughput")
    parser.add_argument("--asks", type=int, default=50, help="asks per A for throughput (at most 64 open)")
    parser.add_argument("--concurrency", default="1,2", help="worker pool sizes to measure, comma-separated")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the in-process turns")
    parser.add_argument("--mode", choices=["async", "wait"], default="async", help="A's ask_agent mode")
    parser.add_argument(
        "--postgres", action="store_true", help=f"use a temporary database on {PG_SERVER} instead of SQLite"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-rtt-"))
    redis = RedisServer(workdir / "redis")
    cleanup = ExitStack()
    try:
        if args.postgres:
            database_url = cleanup.enter_context(postgres_database())
            if database_url is None:
                raise SystemExit(f"PostgreSQL at {PG_SERVER} does not answer")
            database = f"PostgreSQL (a temporary database on {PG_SERVER})"
        else:
            database_url, database = f"sqlite:///{workdir / 'bench.sqlite3'}", f"SQLite (WAL) in {workdir}"
        configure(workdir, redis.base_url, database_url)
        write_playbooks(workdir / "playbooks", args.asks, args.mode)
        import django

        django.setup()
        from django.core.management import call_command
        from redis import Redis

        from agents.actions import load_profiles

        call_command("migrate", verbosity=0)
        load_profiles(entries=PROFILES)
        agora, bare = Agora(args.mode), Bare(os.environ["BENCH_BARE_REDIS_URL"])
        print(f"{os.cpu_count()} cores; {database}; redis-server at {redis.base_url}; ask_agent mode {args.mode}")
        print(f"load average at start: {loadavg()} (other work on the machine slows every figure)", flush=True)

        results: dict[int, list[Round]] = {}
        for concurrency in (int(c) for c in args.concurrency.split(",") if c):
            with workers(concurrency, workdir, bare.app):
                for _ in range(3):  # warm the pool processes: imports, connections, caches
                    agora.round_trip()
                    bare.round_trip()
                rounds = results.setdefault(concurrency, [])
                for i in range(args.rounds):
                    r = Round()
                    r.rtt_ms, r.bare_ms = one_at_a_time(agora, bare, args.trials, max(args.trials, 100))
                    r.rate, r.loaded_rtt_ms, r.turns_per_rtt = agora.throughput(args.pairs, args.asks)
                    r.bare_rate = bare.throughput(args.pairs, max(1000, args.pairs * args.asks))
                    rounds.append(r)
                    print(
                        f"-c {concurrency} round {i + 1}: round trip {med(r.rtt_ms):.1f} ms"
                        f" (bare {med(r.bare_ms):.2f}), {r.rate:.0f} round trips/s (bare {r.bare_rate:.0f}/s)",
                        flush=True,
                    )
        # No worker is left: the doorbells the in-process turns ring go nowhere.
        Redis.from_url(os.environ["REDIS_URL"]).flushdb()
        profile = cProfile.Profile() if args.profile else None
        overhead = pooled([measure_overhead(agora, args.asks, profile) for _ in range(args.rounds)])
        print_table(args, results, overhead, count_on_the_wire(agora, args.asks))
        print(f"\nload average at the end: {loadavg()}")
        if profile is not None:
            print()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    except BaseException:
        for log in sorted(workdir.glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        raise
    finally:
        cleanup.close()
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
