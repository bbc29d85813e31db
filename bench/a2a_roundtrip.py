"""A blocking A2A `SendMessage` round trip through the gateway, next to `ask_agent` over REST.

    .venv/bin/python bench/a2a_roundtrip.py [--rounds R] [--trials T]

Both go through the real stack to the same internal agent on the scripted provider, which replies
with what it was sent: an external agent of the saga sends it a message over A2A (JSON-RPC,
`returnImmediately` false: the call returns with the completed task) or asks it over REST
(`POST /api/v1/sagas/{id}/requests/` with `mode=wait`: the call returns with the reply). The
two alternate, one in flight, over one keep-alive HTTP connection each; a round trip is the
client's wall time for the call. Medians per round, then the median over rounds and the ratio.

It needs nothing running: a temporary data dir with its own SQLite database (or, with `--postgres`,
a temporary database on the local PostgreSQL server), the embedded redis-server on a free port, one
Celery worker (`-c 1`) and one daphne, all killed at the end.
Settings are production's (DEBUG=0).
"""

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.journal_append import PG_SERVER, postgres_database  # noqa: E402
from tests.support import RedisServer, free_port, stop_process, wait_until  # noqa: E402


def configure(workdir: Path, redis_base: str, database_url: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        AGORA_DATA_DIR=str(workdir),
        DATABASE_URL=database_url,
        REDIS_URL=f"{redis_base}/0",
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )


def start(argv: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """A process of the stack, with this environment and `env`, its output in `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, cwd=BASE_DIR, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def start_web(workdir: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """A daphne serving the production web app on a free port, and its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.web:application"]
    return start(argv, workdir / f"web-{port}.log", **env), f"http://127.0.0.1:{port}"


def start_worker(workdir: Path) -> subprocess.Popen[bytes]:
    """One Celery worker, one process (`-c 1`)."""
    celery = ["-m", "celery", "-A", "config", "worker", "-l", "WARNING", "-P", "prefork", "-c", "1"]
    return start([sys.executable, *celery, "--without-mingle", "--without-gossip"], workdir / "worker.log")


def echo_saga(title: str) -> tuple[Any, str]:
    """In the configured database, migrated here: a saga with `agent:echo` (internal, on the scripted
    provider: it replies with what it was sent) and an external `agent:client`; the saga and the
    client's API token."""
    from django.core.management import call_command

    from accounts.models import User
    from agents.actions import load_profiles
    from sagas import actions

    call_command("migrate", verbosity=0)
    load_profiles(entries=[{"name": "bench-echo", "role": "Echo", "model": "scripted:responder",
                            "tools": ["reply"], "resumable": True, "max_turns": 1_000_000}])  # fmt: skip
    owner = User.objects.create_user(username="bench", password=secrets.token_urlsafe(16))
    saga = actions.create_saga(title=title, goal="", owner=owner)
    actions.add_agent(saga=saga, name="echo", role="Echo", task="Echo", runtime="internal", profile="bench-echo",
                      resumable=True, by=owner)  # fmt: skip
    _, token = actions.add_agent(saga=saga, name="client", role="Client", task="Ask", runtime="external", by=owner)
    assert token is not None
    return saga, token


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


class Clients:
    """The external agent's two ways to the echo agent, each on one keep-alive connection."""

    def __init__(self, base: str, saga_id: str, token: str) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"}
        self.rest = httpx.Client(base_url=base, headers=headers, timeout=60)
        self.a2a = httpx.Client(base_url=base, headers={**headers, "A2A-Version": "1.0"}, timeout=60)
        self.saga_id = saga_id

    def rest_round_trip(self) -> float:
        body = {"to": "agent:echo", "type": "bench.ping", "payload": {"text": "ping"}, "mode": "wait", "timeout_s": 30}
        started = time.perf_counter()
        response = self.rest.post(
            f"/api/v1/sagas/{self.saga_id}/requests/", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
        )
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200 and response.json()["status"] == "completed", response.text
        return elapsed

    def a2a_round_trip(self) -> float:
        rpc = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {"message": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "ping"}]}},
        }
        started = time.perf_counter()
        response = self.a2a.post(f"/a2a/{self.saga_id}/echo/", json=rpc)
        elapsed = (time.perf_counter() - started) * 1000
        state = response.json().get("result", {}).get("task", {}).get("status", {}).get("state")
        assert state == "TASK_STATE_COMPLETED", response.text
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=50, help="round trips of each kind per round")
    parser.add_argument("--postgres", action="store_true", help=f"a temporary database on {PG_SERVER}, not SQLite")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-a2a-"))
    redis = RedisServer(workdir / "redis")
    procs: list[subprocess.Popen[bytes]] = []
    cleanup = ExitStack()
    try:
        database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
        if args.postgres:
            database_url = cleanup.enter_context(postgres_database()) or sys.exit(f"No PostgreSQL at {PG_SERVER}")
        configure(workdir, redis.base_url, database_url)
        import django

        django.setup()
        import httpx

        from sagas import actions

        saga, token = echo_saga("A2A bench")
        actions.set_exposed(saga=saga, handle="agent:echo", exposed=True, by=saga.owner)
        procs.append(start_worker(workdir))
        web, base = start_web(workdir)
        procs.append(web)
        clients = Clients(base, str(saga.pk), token)

        def answers() -> bool:
            try:
                return clients.rest.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, timeout=60, interval=0.2, what="the web server and the worker")
        for _ in range(5):  # warm both paths: imports, connections, caches
            clients.rest_round_trip()
            clients.a2a_round_trip()
        database = "PostgreSQL (a temporary database)" if args.postgres else f"SQLite (WAL) in {workdir}"
        print(f"{os.cpu_count()} cores; {database}; one worker -c 1; daphne; load {os.getloadavg()[0]:.2f}")
        a2a_medians, rest_medians = [], []
        for i in range(args.rounds):
            a2a_ms: list[float] = []
            rest_ms: list[float] = []
            for _ in range(args.trials):
                a2a_ms.append(clients.a2a_round_trip())
                rest_ms.append(clients.rest_round_trip())
            a2a_medians.append(statistics.median(a2a_ms))
            rest_medians.append(statistics.median(rest_ms))
            print(f"round {i + 1}: A2A SendMessage {a2a_medians[-1]:.1f} ms (p95 {p95(a2a_ms):.1f}), "
                  f"REST ask_agent wait {rest_medians[-1]:.1f} ms (p95 {p95(rest_ms):.1f})", flush=True)  # fmt: skip
        a2a, rest = statistics.median(a2a_medians), statistics.median(rest_medians)
        print(f"median over rounds: A2A {a2a:.1f} ms, REST {rest:.1f} ms, ratio {a2a / rest:.2f}x (target <= 1.5x)")
    finally:
        for proc in procs:
            stop_process(proc, grace=5)
        cleanup.close()  # the temporary database (dropped with whatever still holds a connection to it)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
