"""The web process on PostgreSQL: its requests with pooled connections (config/web.py) and with a
connection of their own each, side by side.

    .venv/bin/python bench/web_requests.py [--rounds R] [--trials T]

Two daphne processes serve the same app on the same temporary PostgreSQL database, one with
`AGORA_DB_POOL_MAX=20` (the default) and one with `0` (a connection per request, as before the
pool). An external agent calls both, alternately, each over one keep-alive HTTP connection: the
health check, its saga (`GET /api/v1/sagas/{id}/`), and an `ask_agent` in `wait`
mode to an internal agent on the scripted provider, which one Celery worker (`-c 1`) runs (the
call's database work happens before and after its wait: the ask, then a re-check on the wake-up).
Client wall times; medians per round, then the median over rounds and the ratio.

It needs the local PostgreSQL server (a temporary database) and nothing running: the embedded
redis-server on a free port, the worker and both daphnes are started and killed here.
Settings are production's (DEBUG=0).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.a2a_roundtrip import configure, echo_saga, start_web, start_worker  # noqa: E402
from bench.journal_append import PG_SERVER, postgres_database  # noqa: E402
from tests.support import RedisServer, stop_process, wait_until  # noqa: E402

POOLS = {"pooled": "20", "a connection per request": "0"}


class Client:
    """The external agent's calls to one web process, on one keep-alive connection."""

    def __init__(self, base: str, saga_id: str, token: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        self.saga_id = saga_id

    def timed(self, call: Callable[["Client"], bool]) -> float:
        started = time.perf_counter()
        assert call(self)
        return (time.perf_counter() - started) * 1000

    def health(self) -> bool:
        return self.http.get("/healthz").status_code == 200

    def saga(self) -> bool:
        return self.http.get(f"/api/v1/sagas/{self.saga_id}/").status_code == 200

    def ask(self) -> bool:
        body = {"to": "agent:echo", "type": "bench.ping", "payload": {"text": "ping"}, "mode": "wait", "timeout_s": 30}
        response = self.http.post(
            f"/api/v1/sagas/{self.saga_id}/requests/", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
        )
        return response.status_code == 200 and response.json()["status"] == "completed"


CALLS = {"GET /healthz": Client.health, "GET /api/v1/sagas/{id}/": Client.saga, "ask_agent, mode=wait": Client.ask}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=100, help="calls of each kind to each web process per round")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-web-"))
    redis = RedisServer(workdir / "redis")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with postgres_database() as database_url:
            if database_url is None:
                sys.exit(f"PostgreSQL does not answer at {PG_SERVER}")
            configure(workdir, redis.base_url, database_url)
            import django

            django.setup()
            saga, token = echo_saga("web bench")
            procs.append(start_worker(workdir))
            clients = {}
            for label, pool in POOLS.items():
                web, base = start_web(workdir, AGORA_DB_POOL_MAX=pool)
                procs.append(web)
                clients[label] = Client(base, str(saga.pk), token)
            for client in clients.values():
                wait_until(partial(answers, client), timeout=60, interval=0.2, what="the web servers and the worker")
                for call in CALLS.values():  # warm: imports, connections, caches
                    for _ in range(5):
                        client.timed(call)
            print(f"{os.cpu_count()} cores; PostgreSQL at {PG_SERVER}; two daphnes; load {os.getloadavg()[0]:.2f}")
            medians: dict[tuple[str, str], list[float]] = {}
            for i in range(args.rounds):
                times: dict[tuple[str, str], list[float]] = {(c, p): [] for c in CALLS for p in POOLS}
                for _ in range(args.trials):
                    for call_name, call in CALLS.items():
                        for label, client in clients.items():  # alternately: the same load on both
                            times[call_name, label].append(client.timed(call))
                for key, values in times.items():
                    medians.setdefault(key, []).append(statistics.median(values))
                print(f"round {i + 1}: " + ", ".join(
                    f"{c} {medians[c, 'pooled'][-1]:.2f} / {medians[c, 'a connection per request'][-1]:.2f} ms"
                    for c in CALLS), flush=True)  # fmt: skip
            print(f"\nmedian over {args.rounds} rounds of {args.trials} calls each (client wall time, ms)")
            print(f"  {'':<26}{'pooled':>10}{'a connection per request':>28}{'ratio':>8}")
            for call_name in CALLS:
                pooled = statistics.median(medians[call_name, "pooled"])
                single = statistics.median(medians[call_name, "a connection per request"])
                print(f"  {call_name:<26}{pooled:>10.2f}{single:>28.2f}{single / pooled:>7.2f}x")
            print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for proc in procs:
            stop_process(proc, grace=5)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def answers(client: Client) -> bool:
    import httpx

    try:
        return client.health()
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
