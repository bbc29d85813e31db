"""Capacity: what one ask_agent round trip costs each part of the stack, and which part runs out first.

    .venv/bin/python bench/capacity.py [--postgres] [--rounds R] [--pairs P] [--asks N]

The workload is bench/ask_agent_rtt.py's throughput load (P A/B pairs at once, each A asking its B
N times on the scripted provider, one Celery worker `-P prefork`, `-c 1` then `-c 2`), measured
from outside the processes:
- round trips and turns per second;
- CPU seconds, read from /proc, of the worker (all processes of its group), the PostgreSQL
  backends serving the benchmark's database (on SQLite the database works inside the workers),
  the Redis server (its INFO cpu) and this client, and of the whole machine (/proc/stat: other work
  on it shows there), as cores busy and per round trip;
- Redis commands per round trip (INFO commandstats before and after; the Redis server is this
  benchmark's own), with the most frequent ones.
Then, with the workers stopped, every turn of one A/B pair is run in this process, one at a time,
counting what a round trip asks of the database: statements (Django's execute_wrapper),
transactions (commits, and statements run outside a transaction, each its own), the time spent
inside transactions (on SQLite the single writer's lock is held all that time; on PostgreSQL the
saga's lock), Redis commands, and on PostgreSQL the server's own count (pg_stat_database: commits
and rows written) as a cross-check. Last, the ceilings these figures imply and the utilisation of
each part at the measured load: what saturates first.

It needs nothing running: like bench/ask_agent_rtt.py it makes a temporary data dir (or a
temporary PostgreSQL database with --postgres), the embedded redis-server on a free port and its
own workers, all removed at the end. Settings are production's (DEBUG=0).
"""

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.ask_agent_stack import PROFILES, Agora, Worker, configure, loadavg, write_playbooks  # noqa: E402
from bench.journal_append import PG_SERVER, postgres_database  # noqa: E402
from tests.support import RedisServer  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


# --- counters read from outside the processes ------------------------------------------------------


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces): field 3 onwards."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each live pid."""
    seconds = {}
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None:
            seconds[pid] = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return seconds


def group(pgid: int) -> list[int]:
    """The pids of a process group: a worker's main process and its pool."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((line for line in status.splitlines() if line.startswith("VmRSS:")), "VmRSS: 0 kB")
    return int(line.split()[1]) / 1024


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


def pg_backends() -> list[int]:
    """The server processes serving this benchmark's database, but for this client's own."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


def pg_counters() -> dict[str, int]:
    """The database's own counters, read from another database (a read here adds to no count of
    this one), once they stop moving: a backend reports its counts when it exits, or with a delay."""
    import psycopg
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    names = ["xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted"]
    query = f"SELECT {', '.join(names)} FROM pg_stat_database WHERE datname = %s"
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as admin:

        def read() -> dict[str, int]:
            admin.execute("SELECT pg_stat_clear_snapshot()")
            row = admin.execute(query, [connection.settings_dict["NAME"]]).fetchone()
            assert row is not None
            return dict(zip(names, row, strict=True))

        last, deadline = read(), time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.3)
            if (now := read()) == last:
                break
            last = now
    return last


def redis_info(client: Any) -> tuple[float, Counter[str]]:
    """(CPU seconds of the Redis server, calls per command)."""
    cpu = client.info("cpu")
    calls = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in client.info("commandstats").items()})
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Snapshot:
    wall: float
    worker: dict[int, float]
    database: dict[int, float]
    redis_cpu: float
    redis_calls: Counter[str]
    client: float
    machine: tuple[float, float]

    @classmethod
    def take(cls, worker: Worker, redis: Any) -> "Snapshot":
        redis_cpu, calls = redis_info(redis)
        return cls(time.monotonic(), cpu_of(group(worker.proc.pid)), cpu_of(pg_backends()), redis_cpu, calls,
                   own_cpu(), machine_busy())  # fmt: skip


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings of a set of processes (one that appeared in between from zero)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


@dataclass
class Load:
    """One round of the throughput load under one worker configuration."""

    round_trips: int
    rate: float  # round trips per second, first ask to last reply
    turns_per_rtt: float
    wall: float  # seconds between the snapshots
    worker: float  # CPU seconds
    database: float
    redis: float
    client: float
    machine_busy: float  # cores busy, whole machine
    redis_calls: Counter[str] = field(default_factory=Counter)
    rss_mb: list[float] = field(default_factory=list)  # the worker's processes, main first

    @property
    def turns_per_s(self) -> float:
        return self.rate * self.turns_per_rtt

    def per_rtt_ms(self, cpu: float) -> float:
        return cpu / self.round_trips * 1000

    def cores(self, cpu: float) -> float:
        return cpu / self.wall


def measure_load(agora: Agora, worker: Worker, redis: Any, pairs: int, asks: int) -> Load:
    before = Snapshot.take(worker, redis)
    rate, _, turns_per_rtt = agora.throughput(pairs, asks)
    after = Snapshot.take(worker, redis)
    wall = after.wall - before.wall
    busy = (after.machine[0] - before.machine[0]) / (after.machine[1] - before.machine[1]) * (os.cpu_count() or 1)
    return Load(
        round_trips=pairs * asks, rate=rate, turns_per_rtt=turns_per_rtt, wall=wall,
        worker=spent(before.worker, after.worker), database=spent(before.database, after.database),
        redis=after.redis_cpu - before.redis_cpu, client=after.client - before.client, machine_busy=busy,
        redis_calls=after.redis_calls - before.redis_calls,
        rss_mb=[rss_mb(pid) for pid in sorted(group(worker.proc.pid), key=lambda p: p != worker.proc.pid)],
    )  # fmt: skip


# --- what one round trip asks of the database, counted in process ----------------------------------------


@dataclass
class Counts:
    statements: int = 0
    transactions: int = 0
    in_transaction_s: float = 0.0
    bookkeeping: int = 0  # this loop's own statements, outside turns (each its own transaction)


@contextmanager
def counting(counts: Counts, in_turn: list[bool]) -> Iterator[None]:
    """Count statements and transactions on this process's connection, and time spent in transactions.
    Django's atomic() turns autocommit off at its outermost entry and on again after the commit."""
    from django.db import connection

    connection.ensure_connection()
    original = connection.set_autocommit
    began = [0.0]

    def set_autocommit(autocommit: bool, *args: Any, **kwargs: Any) -> None:
        if not autocommit:
            began[0] = time.perf_counter()
        original(autocommit, *args, **kwargs)
        if autocommit and began[0]:
            counts.in_transaction_s += time.perf_counter() - began[0]
            counts.transactions += in_turn[0]
            began[0] = 0.0

    def execute(run: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        alone = connection.get_autocommit()  # outside atomic(): a transaction of its own
        if in_turn[0]:
            counts.statements += 1
            counts.transactions += alone
        else:
            counts.bookkeeping += alone
        return run(sql, params, many, context)

    connection.set_autocommit = set_autocommit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(execute):
            yield
    finally:
        del connection.set_autocommit


@dataclass
class PerRoundTrip:
    round_trips: int
    statements: float
    transactions: float
    in_transaction_ms: float
    turns: float
    redis_calls: Counter[str]
    pg: dict[str, float]  # the server's counters per round trip (PostgreSQL only)


def count_round_trips(agora: Agora, redis: Any, asks: int) -> PerRoundTrip:
    """Every turn of one A/B pair (A asks `asks` times), run here one at a time with no worker around."""
    from django.db import connection

    from agents import executor
    from sagas.models import Run

    saga = agora.saga()
    agora.add(saga, "b", "bench-responder")
    agora.add(saga, "a", "bench-asker-n")
    connection.close()  # this client's backend reports its counters as it exits
    pg_before = pg_counters()
    _, calls_before = redis_info(redis)
    counts, in_turn, turns = Counts(), [False], 0
    queued = Run.objects.filter(collaborator__saga=saga, status=Run.Status.QUEUED).values_list("pk", flat=True)
    with counting(counts, in_turn):
        while batch := list(queued.all()):  # a fresh query each time
            for run_id in batch:
                in_turn[0] = True
                executor.run_turn(run_id)
                in_turn[0] = False
    _, calls_after = redis_info(redis)
    turns = sum(Run.objects.filter(collaborator__saga=saga).values_list("turn", flat=True))
    counts.bookkeeping += 1  # the line above
    connection.close()
    pg_after = pg_counters()
    pg = {k: (pg_after[k] - pg_before[k]) / asks for k in pg_after}
    if pg:
        pg["xact_commit"] -= counts.bookkeeping / asks  # this loop's own reads
    return PerRoundTrip(
        round_trips=asks, statements=counts.statements / asks, transactions=counts.transactions / asks,
        in_transaction_ms=counts.in_transaction_s * 1000 / asks, turns=turns / asks,
        redis_calls=calls_after - calls_before, pg=pg,
    )  # fmt: skip


# --- the report --------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values)


def row(label: str, values: list[str]) -> None:
    print(f"  {label:<66}" + "".join(f"{v:>14}" for v in values))


def top(calls: Counter[str], per: int, n: int = 6) -> str:
    return ", ".join(f"{name} {count / per:.1f}" for name, count in calls.most_common(n))


def report(args: argparse.Namespace, postgres: bool, loads: dict[int, list[Load]], per: PerRoundTrip) -> None:
    cores = os.cpu_count() or 1
    configs = sorted(loads)

    def m(f: Any) -> list[float]:
        return [med([f(load) for load in loads[c]]) for c in configs]

    print(f"\nunder load: median of {args.rounds} rounds, {args.pairs} pairs x {args.asks} asks each")
    row("one Celery worker, prefork pool of", [f"-c {c}" for c in configs])
    row("round trips per second", [f"{v:.0f}" for v in m(lambda x: x.rate)])
    row("turns per second", [f"{v:.0f}" for v in m(lambda x: x.turns_per_s)])
    row("turns per round trip", [f"{v:.2f}" for v in m(lambda x: x.turns_per_rtt)])
    row("CPU ms per round trip: worker (all its processes)", [f"{v:.2f}" for v in m(lambda x: x.per_rtt_ms(x.worker))])
    if postgres:
        row("CPU ms per round trip: PostgreSQL backends", [f"{v:.2f}" for v in m(lambda x: x.per_rtt_ms(x.database))])
    row("CPU ms per round trip: Redis", [f"{v:.3f}" for v in m(lambda x: x.per_rtt_ms(x.redis))])
    row("CPU ms per round trip: this client (asks, polls)", [f"{v:.2f}" for v in m(lambda x: x.per_rtt_ms(x.client))])
    row("cores busy: worker", [f"{v:.2f}" for v in m(lambda x: x.cores(x.worker))])
    if postgres:
        row("cores busy: PostgreSQL backends", [f"{v:.2f}" for v in m(lambda x: x.cores(x.database))])
    row("cores busy: Redis", [f"{v:.2f}" for v in m(lambda x: x.cores(x.redis))])
    row(
        f"cores busy: whole machine, of {cores} (other work included)",
        [f"{v:.2f}" for v in m(lambda x: x.machine_busy)],
    )
    row("turns per worker CPU-second (turns/s per worker core)",
        [f"{v:.0f}" for v in m(lambda x: x.turns_per_rtt * x.round_trips / x.worker)])  # fmt: skip
    row("Redis commands per round trip", [f"{v:.1f}" for v in m(lambda x: x.redis_calls.total() / x.round_trips)])
    row("memory per worker process, RSS MB: main / pool process",
        [f"{med([x.rss_mb[0] for x in loads[c]]):.0f} / {med([med(x.rss_mb[1:]) for x in loads[c]]):.0f}"
         for c in configs])  # fmt: skip
    for c in configs:
        load = loads[c][-1]
        print(f"    -c {c}, last round, Redis commands per round trip: {top(load.redis_calls, load.round_trips)}")

    print(f"\none round trip, counted in process ({per.round_trips} round trips of one pair, turns one at a time):")
    row("turns per round trip", [f"{per.turns:.2f}"])
    row("SQL statements per round trip / per turn", [f"{per.statements:.1f} / {per.statements / per.turns:.1f}"])
    row("transactions (commits) per round trip / per turn",
        [f"{per.transactions:.1f} / {per.transactions / per.turns:.1f}"])  # fmt: skip
    row("time inside transactions per round trip: ms", [f"{per.in_transaction_ms:.2f}"])
    row("Redis commands per round trip (no worker fetching)", [f"{per.redis_calls.total() / per.round_trips:.1f}"])
    print(f"    {top(per.redis_calls, per.round_trips)}")
    if per.pg:
        row("PostgreSQL's count: commits per round trip", [f"{per.pg['xact_commit']:.1f}"])
        row("PostgreSQL's count: rows inserted / updated / deleted",
            [f"{per.pg['tup_inserted']:.1f} / {per.pg['tup_updated']:.1f} / {per.pg['tup_deleted']:.1f}"])  # fmt: skip

    # Ceilings: each part's rate if it alone were the limit, from its cost per round trip measured above.
    best = max(configs)
    load = sorted(loads[best], key=lambda x: x.rate)[len(loads[best]) // 2]
    worker_s, redis_s, db_s = (cpu / load.round_trips for cpu in (load.worker, load.redis, load.database))
    print(f"\nceilings implied (round trips per second), from -c {best}'s median round:")
    row("per worker core (1 / worker CPU per round trip)", [f"{1 / worker_s:.0f}"])
    row("Redis, one core (1 / its CPU per round trip)", [f"{1 / redis_s:.0f}" if redis_s else "-"])
    if postgres:
        row("per PostgreSQL core (1 / backend CPU per round trip)", [f"{1 / db_s:.0f}" if db_s else "-"])
        row("one saga (its lock held inside transactions, serially)", [f"{1000 / per.in_transaction_ms:.0f}"])
    else:
        row("SQLite's one writer (transactions one at a time)", [f"{1000 / per.in_transaction_ms:.0f}"])
    row(f"all on this machine's {cores} cores (worker + database + Redis CPU)",
        [f"{cores / (worker_s + redis_s + db_s):.0f}"])  # fmt: skip
    print(f"\nutilisation at -c {best}'s median load ({load.rate:.0f} round trips/s):")
    row(f"worker: {load.cores(load.worker):.2f} cores busy of {best} pool processes",
        [f"{load.cores(load.worker) / best:.0%}"])  # fmt: skip
    row("Redis: of its one core", [f"{load.cores(load.redis):.0%}"])
    if postgres:  # each pair has a saga, and so a lock, of its own
        row(f"one saga's lock: time inside transactions x its rate (1/{args.pairs})",
            [f"{per.in_transaction_ms * load.rate / args.pairs / 1000:.0%}"])  # fmt: skip
    else:
        row("SQLite's one writer: time inside transactions x rate", [f"{per.in_transaction_ms * load.rate / 1000:.0%}"])
    if postgres:
        row(f"PostgreSQL backends: of {cores} cores", [f"{load.cores(load.database) / cores:.0%}"])
    row(f"whole machine: of {cores} cores", [f"{load.machine_busy / cores:.0%}"])


# --- main --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=8, help="A/B pairs at once")
    parser.add_argument("--asks", type=int, default=50, help="asks per A (at most 64 open)")
    parser.add_argument("--concurrency", default="1,2", help="worker pool sizes, comma-separated")
    parser.add_argument("--postgres", action="store_true", help=f"a temporary database on {PG_SERVER}")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-capacity-"))
    redis_server = RedisServer(workdir / "redis")
    cleanup = ExitStack()
    try:
        if args.postgres:
            database_url = cleanup.enter_context(postgres_database())
            if database_url is None:
                raise SystemExit(f"PostgreSQL at {PG_SERVER} does not answer")
        else:
            database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
        configure(workdir, redis_server.base_url, database_url)
        write_playbooks(workdir / "playbooks", args.asks)
        import django

        django.setup()
        from django.core.management import call_command
        from redis import Redis

        from agents.actions import load_profiles
        from config.celery import app

        call_command("migrate", verbosity=0)
        load_profiles(entries=PROFILES)
        redis = Redis.from_url(os.environ["REDIS_URL"])
        agora = Agora()
        database = "PostgreSQL (a temporary database)" if args.postgres else "SQLite (WAL)"
        print(f"{os.cpu_count()} cores; {database}; redis-server {redis.info('server')['redis_version']}")
        print(f"load average at start: {loadavg()} (other work on the machine slows every figure)", flush=True)

        loads: dict[int, list[Load]] = {}
        for concurrency in (int(c) for c in args.concurrency.split(",") if c):
            worker = Worker("config", concurrency, workdir, lambda n: bool(app.control.ping([n], timeout=0.3)))
            try:
                for _ in range(3):  # warm the pool processes: imports, connections, caches
                    agora.round_trip()
                for i in range(args.rounds):
                    load = measure_load(agora, worker, redis, args.pairs, args.asks)
                    loads.setdefault(concurrency, []).append(load)
                    print(f"-c {concurrency} round {i + 1}: {load.rate:.0f} round trips/s, {load.turns_per_s:.0f} "
                          f"turns/s; load average {loadavg()}", flush=True)  # fmt: skip
            finally:
                worker.stop()
        redis.flushdb()  # no worker is left: the rings of the in-process turns go nowhere
        per = count_round_trips(agora, redis, args.asks)
        report(args, args.postgres, loads, per)
        print(f"\nload average at the end: {loadavg()}")
    except BaseException:
        for log in sorted(workdir.glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        raise
    finally:
        cleanup.close()
        redis_server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
