"""Gap-free, commit-ordered seq under concurrent writer processes (PostgreSQL and SQLite alike)."""

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from journal.models import JournalEvent
from sagas.models import Saga
from tests.support import BASE_DIR, child_env, kill_group

pytestmark = pytest.mark.django_db(transaction=True)

WRITERS = 8
EVENTS_PER_WRITER = 50

# Each writer sets Django up, says "ready", waits for "go" on stdin so that all of them start
# writing at once, then records its events one transaction each, as actions do.
WRITER = """
import sys
import django
django.setup()
from journal.actions import record
saga_id, writer, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
for n in range(count):
    record(saga_id=saga_id, type="bench.write", actor=f"agent:writer-{writer}", data={"writer": writer, "n": n})
print("done", flush=True)
"""


def start_writer(saga: Saga, writer: int, redis_url: str, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", WRITER, str(saga.pk), str(writer), str(EVENTS_PER_WRITER)],
            cwd=BASE_DIR,
            env=child_env(redis_url),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )


def visible_seqs(saga: Saga) -> list[int]:
    return list(JournalEvent.objects.for_saga(saga.pk).values_list("seq", flat=True))


def test_eight_writer_processes_get_gap_free_commit_ordered_seqs(
    saga: Saga, base_seq: int, redis_url: str, artifacts: Path
) -> None:
    writers: list[subprocess.Popen[str]] = []
    try:
        writers = [start_writer(saga, i, redis_url, artifacts / f"writer-{i}.log") for i in range(WRITERS)]
        for i, proc in enumerate(writers):
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until ready or EOF; pytest-timeout bounds it
            assert line == "ready\n", f"writer {i} did not start:\n{(artifacts / f'writer-{i}.log').read_text()}"
        for proc in writers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()

        # While they write, every snapshot a reader takes must be a prefix 1..M: a later seq never
        # becomes visible before an earlier one, which is what cursor-based readers rely on.
        snapshots = 0
        deadline = time.monotonic() + 120
        while any(proc.poll() is None for proc in writers):
            seen = visible_seqs(saga)
            assert seen == list(range(1, len(seen) + 1)), f"a reader saw a hole: {seen}"
            snapshots += 1
            assert time.monotonic() < deadline, "writers did not finish within 120s"
        for i, proc in enumerate(writers):
            assert proc.wait() == 0, f"writer {i} failed:\n{(artifacts / f'writer-{i}.log').read_text()}"
    finally:
        for proc in writers:
            kill_group(proc)
            proc.wait()

    total = base_seq + WRITERS * EVENTS_PER_WRITER
    events = list(JournalEvent.objects.for_saga(saga.pk))
    assert [e.seq for e in events] == list(range(1, total + 1))
    written = events[base_seq:]
    assert sorted((e.data["writer"], e.data["n"]) for e in written) == [
        (w, n) for w in range(WRITERS) for n in range(EVENTS_PER_WRITER)
    ]
    # Each writer's events carry increasing seqs in the order it wrote them.
    for w in range(WRITERS):
        assert [e.data["n"] for e in written if e.data["writer"] == w] == list(range(EVENTS_PER_WRITER))
    # The writers really interleaved: otherwise this test would prove nothing about concurrency.
    runs = sum(1 for a, b in itertools.pairwise(written) if a.data["writer"] != b.data["writer"])
    assert runs >= WRITERS, json.dumps([e.data["writer"] for e in written])
    # created_at is taken after the seq is allocated, while the saga's writers are serialised, so
    # seq order is also time order across processes.
    stamps = [e.created_at for e in events]
    assert stamps == sorted(stamps)
    assert snapshots > 0
