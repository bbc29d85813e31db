"""`python -m config.stack` (what `make run` runs), end to end on its embedded defaults.

These start the real supervisor with its own data dir, SQLite database and embedded Redis, so they
do not depend on DATABASE_URL or REDIS_URL: both are removed from its environment.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import RedisError

from tests.support import BASE_DIR, free_port, kill_group, wait_until

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 90.0
EXIT_TIMEOUT_S = 40.0  # the supervisor's grace for its children is 10s
STALE = "counter_999999999.db"


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a live process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def descendants(root: int) -> dict[int, int]:
    """Every process below root, as pid -> start time (so a reused pid is not mistaken for it)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))):
            children.setdefault(stat[1], []).append((int(entry.name), stat[2]))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            found[pid] = started
            todo.append(pid)
    return found


def alive(pid: int, started: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[2] == started and stat[0] not in ("Z", "X")


def survivors(tree: dict[int, int]) -> dict[int, str]:
    return {pid: cmdline(pid) for pid, started in tree.items() if alive(pid, started)}


class Supervisor:
    """One `python -m config.stack` in its own process group, with everything private to this test."""

    def __init__(self, tmp_path: Path, log_path: Path) -> None:
        self.web_port = free_port()
        self.redis_port = free_port()
        self.log_path = log_path
        self.data_dir = tmp_path / "data"
        (self.data_dir / "metrics").mkdir(parents=True)
        (self.data_dir / "metrics" / STALE).write_bytes(b"")  # as a previous start would leave it
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(
            AGORA_DATA_DIR=str(self.data_dir),
            WEB_HOST="127.0.0.1",
            WEB_PORT=str(self.web_port),
            AGORA_REDIS_PORT=str(self.redis_port),
            WORKER_CONCURRENCY="1",
            WORKER_QUEUES="celery,bulk",
            PYTHONUNBUFFERED="1",
        )
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "config.stack"],
                cwd=BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.tree: dict[int, int] = {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> tuple[int, dict[str, str]] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/healthz", timeout=3) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
        except (urllib.error.URLError, OSError):
            return None

    def wait_healthy(self) -> None:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the supervisor exited with {self.proc.returncode}:\n{self.log()}")
            return self.health() == (200, {"db": "ok", "redis": "ok", "worker": "ok"})

        wait_until(healthy, timeout=READY_TIMEOUT_S, interval=0.5, what="/healthz to answer 200 with all ok")
        self.tree = descendants(self.proc.pid)
        commands = [cmdline(pid) for pid in self.tree]
        for part in ("redis-server", "daphne", "worker", "beat"):
            assert any(part in command for command in commands), f"no {part} among {commands}"

    def child(self, *words: str) -> int:
        """The pid of the supervisor's direct child whose command line has all these words."""
        direct = [pid for pid in self.tree if (stat := proc_stat(pid)) and stat[1] == self.proc.pid]
        matches = [pid for pid in direct if all(word in cmdline(pid).split() for word in words)]
        assert len(matches) == 1, f"no single child {words} among {[cmdline(pid) for pid in direct]}"
        return matches[0]

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the supervisor did not exit:\n{self.log()}") from None

    def redis_answers(self) -> bool:
        try:
            with Redis(host="127.0.0.1", port=self.redis_port, socket_connect_timeout=0.5) as client:
                return bool(client.ping())
        except (RedisError, OSError):
            return False

    def kill_everything(self) -> None:
        """Cleanup, whatever happened: the supervisor's group, then anything left below it."""
        if self.proc.poll() is None:
            self.tree.update(descendants(self.proc.pid))
        kill_group(self.proc)  # only while the supervisor is unreaped: its group id is still ours
        self.proc.wait()
        for pid, started in self.tree.items():
            if alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervisor(tmp_path: Path, artifacts: Path) -> Iterator[Supervisor]:
    stack = Supervisor(tmp_path, artifacts / "stack.log")
    try:
        yield stack
    finally:
        stack.kill_everything()


def test_the_stack_comes_up_healthy_and_ctrl_c_leaves_no_process_behind(supervisor: Supervisor) -> None:
    supervisor.wait_healthy()
    # Its processes count into one emptied directory, and `/metrics` answers loopback in DEBUG.
    assert not (supervisor.data_dir / "metrics" / STALE).exists()
    with urllib.request.urlopen(f"http://127.0.0.1:{supervisor.web_port}/metrics", timeout=5) as response:
        assert "agora_workers 1.0" in response.read().decode()
    wait_until(lambda: f"Agora is up at http://127.0.0.1:{supervisor.web_port}/" in supervisor.log(), what="the URL")
    assert supervisor.redis_answers()
    # The production commands (config/production.py), on this machine's settings.
    worker = cmdline(supervisor.child("celery", "worker")).split()
    assert worker[worker.index("--concurrency") + 1] == "1" and worker[worker.index("-Q") + 1] == "celery,bulk"
    beat = cmdline(supervisor.child("celery", "beat")).split()
    assert beat[beat.index("--schedule") + 1] == str(supervisor.data_dir / "celerybeat-schedule")

    os.kill(supervisor.proc.pid, signal.SIGINT)  # to the supervisor only, as Ctrl-C in `make run` would

    assert supervisor.wait_exit() == 0
    assert "SIGINT received; stopping" in supervisor.log()
    wait_until(lambda: not survivors(supervisor.tree), timeout=15, what="every child to be gone")
    assert not supervisor.redis_answers()


def test_when_a_child_dies_the_supervisor_names_it_and_stops_the_rest(supervisor: Supervisor) -> None:
    supervisor.wait_healthy()
    worker = supervisor.child("celery", "worker")

    os.killpg(worker, signal.SIGKILL)  # the worker and its pool, as a crash or the OOM killer would

    assert supervisor.wait_exit() == 1
    assert "agora: worker exited with status -9; stopping everything" in supervisor.log()
    wait_until(lambda: not survivors(supervisor.tree), timeout=15, what="every other child to be gone")
    assert not supervisor.redis_answers()


def test_children_die_with_the_supervisor_even_when_it_is_killed(supervisor: Supervisor) -> None:
    supervisor.wait_healthy()

    os.kill(supervisor.proc.pid, signal.SIGKILL)  # no chance to clean up: the kernel's death signal must

    supervisor.wait_exit()
    try:
        wait_until(lambda: not survivors(supervisor.tree), timeout=30, interval=0.2, what="every orphan to be gone")
    except AssertionError:
        raise AssertionError(f"survivors: {survivors(supervisor.tree)}\n{supervisor.log()}") from None
    assert not supervisor.redis_answers()
