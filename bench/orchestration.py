"""The orchestrator's parallel speedup and its own overhead, through the real stack.

    .venv/bin/python bench/orchestration.py [--workers 1,2,4] [--latency 1.0] [--rounds 3]

Every model is the local fake OpenAI-compatible server (tests/agents/fake_llm.py), over HTTP with
the real `openai` client: the router answers at once with a plan of N support workers, each worker
answers after a fixed latency (`--latency`, slept in the server's request thread, so calls in
flight overlap as they would on a real provider), and the primary answers at once; no review.

For each N, one orchestration per round on a Celery worker with N pool processes (`-c N`: the
workers side by side), and the same orchestration on a worker with one (`-c 1`: the same N run one
after another). The speedup is the support-worker phase (from `plan.created` to the primary's
`worker_start`) one after another over side by side, printed beside N (target: at least 0.8 N).

The overhead is read from the journal of the side-by-side runs: each step's wall time minus the
model time inside it (the `llm_call` latencies): routing (`prompt.submitted` → `plan.created`),
the support phase (minus the slowest worker's model call), the primary (its `worker_start` →
`prompt.completed`), and per worker (its `worker_start` → `worker_end`, minus its model call).

Needs nothing running: a temporary data dir with its own SQLite database, the embedded
redis-server on a free port, its worker processes; all killed at the end.
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
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from tests.agents.fake_llm import FakeLLM, say, tool_call  # noqa: E402
from tests.support import RedisServer, stop_process, wait_until  # noqa: E402


def configure(workdir: Path, redis_base: str, llm_url: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        AGORA_DATA_DIR=str(workdir),
        DATABASE_URL=f"sqlite:///{workdir / 'bench.sqlite3'}",
        REDIS_URL=f"{redis_base}/0",
        OPENAI_BASE_URL=llm_url,
        OPENAI_API_KEY="bench",
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )


def program(fake: FakeLLM, max_workers: int, latency: float) -> None:
    roles = [f"r{i}" for i in range(max_workers)]

    def router(body: dict[str, Any]) -> dict[str, Any]:
        wanted = int(body["messages"][-1]["content"].rsplit("WORKERS=", 1)[1].split()[0])
        workers = ", ".join(f'{{"role": "{r}", "goal": "Part {r}."}}' for r in roles[:wanted])
        return say(f'{{"primary_role": "p", "workers": [{workers}], "requires_review": false, "reason": "bench"}}')

    def worker(body: dict[str, Any]) -> dict[str, Any]:
        time.sleep(latency)
        return say("", tool_call("finish", {"result": {"summary": "done", "progress": {"status": "completed"}}}))

    fake.rule("router-m", router)
    fake.rule("worker-m", worker)
    fake.rule("primary-m", lambda body: say("", tool_call("finish", {"result": "The answer."})))


def load(max_workers: int) -> None:
    from agents.actions import load_profiles
    from agents.orchestrator.actions import load_brains

    profiles = [
        {"name": "b-router", "role": "Router", "model": "router-m", "tools": ["finish"]},
        {"name": "b-worker", "role": "Worker", "model": "worker-m", "tools": ["finish"]},
        {"name": "b-primary", "role": "Primary", "model": "primary-m", "tools": ["finish"]},
    ]
    load_profiles(entries=profiles)
    roles = {f"r{i}": "b-worker" for i in range(max_workers)} | {"p": "b-primary"}
    load_brains(
        entries=[
            {"name": "bench", "planner_profile": "b-router", "roles": roles, "default_primary": "p",
             "review_role": "", "review_by_default": False, "max_parallel_agents": max_workers}
        ]
    )  # fmt: skip


class Worker:
    def __init__(self, concurrency: int, logdir: Path) -> None:
        from config.celery import app

        self.name = f"bench-{uuid.uuid4().hex[:8]}@localhost"
        argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "-n", self.name, "-l", "WARNING",
                "-P", "prefork", "-c", str(concurrency), "--without-mingle", "--without-gossip"]  # fmt: skip
        with (logdir / f"worker-c{concurrency}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=BASE_DIR, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_until(lambda: bool(app.control.ping([self.name], timeout=0.3)), timeout=60, interval=0.2, what="worker")

    def stop(self) -> None:
        stop_process(self.proc, grace=5)


def orchestrate(owner: Any, n: int) -> Any:
    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.models import Prompt
    from sagas.actions import create_saga

    saga = create_saga(title=f"bench {uuid.uuid4().hex[:6]}", owner=owner)
    prompt, _ = submit_prompt(saga=saga, by=owner, text=f"Split this. WORKERS={n} ", brain="bench")
    wait_until(
        lambda: Prompt.objects.filter(pk=prompt.pk).exclude(status="running").exists(),
        timeout=120, interval=0.02, what="the orchestration",
    )  # fmt: skip
    prompt.refresh_from_db()
    if prompt.status != "completed":
        raise RuntimeError(f"orchestration {prompt.pk} {prompt.status}: {prompt.reason}")
    return prompt


def timeline(prompt: Any) -> dict[str, Any]:
    """Step walls and model times from the prompt's journal, in ms."""
    from journal.models import JournalEvent

    events = list(JournalEvent.objects.filter(saga=prompt.saga).order_by("seq"))
    at = {e.type: e.created_at.timestamp() * 1000 for e in events if "." in e.type}
    primary = prompt.worker_name("primary")
    by_actor: dict[str, dict[str, Any]] = {}
    for e in events:
        slot = by_actor.setdefault(e.actor, {})
        if e.type in ("worker_start", "worker_end"):
            slot[e.type] = e.created_at.timestamp() * 1000
        elif e.type == "llm_call":
            slot["model_ms"] = slot.get("model_ms", 0.0) + e.data["latency_ms"]
    lead = f"agent:{prompt.lead_name}"
    primary_start = by_actor[f"agent:{primary}"]["worker_start"]
    support = [v for k, v in by_actor.items() if k.startswith(lead + ".") and k != f"agent:{primary}"]
    slowest_model = max((w.get("model_ms", 0.0) for w in support), default=0.0)
    return {
        "phase_ms": primary_start - at["plan.created"],
        "routing_overhead": at["plan.created"] - at["prompt.submitted"] - by_actor[lead].get("model_ms", 0.0),
        "support_overhead": primary_start - at["plan.created"] - slowest_model,
        "primary_overhead": at["prompt.completed"] - primary_start - by_actor[f"agent:{primary}"].get("model_ms", 0.0),
        "per_worker": [w["worker_end"] - w["worker_start"] - w.get("model_ms", 0.0) for w in support],
        # The support step's two doorbell hops: the workers' first turns start, the primary starts.
        "dispatch": min(w["worker_start"] for w in support) - at["plan.created"],
        "collect": primary_start - max(w["worker_end"] for w in support),
    }


LABELS = {
    "dispatch": "  of which plan.created → first worker_start",
    "collect": "  of which last worker_end → primary start",
    "worker": "per worker (worker_start → worker_end)",
}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4", help="support workers per orchestration, comma-separated")
    parser.add_argument("--latency", type=float, default=1.0, help="each support worker's model latency, seconds")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(n) for n in args.workers.split(",") if n]

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-orch-"))
    redis = RedisServer(workdir / "redis")
    fake = FakeLLM()
    try:
        configure(workdir, redis.base_url, fake.url)
        program(fake, max(sizes), args.latency)
        import django

        django.setup()
        from django.core.management import call_command

        from accounts.models import User

        call_command("migrate", verbosity=0)
        load(max(sizes))
        owner = User.objects.create_user(username="bench")
        print(f"{os.cpu_count()} cores; SQLite (WAL); model latency {args.latency:.2f} s per support worker")
        print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
        phases: dict[tuple[int, int], list[float]] = {}
        overheads: dict[str, list[float]] = {
            "routing": [], "support": [], "dispatch": [], "collect": [], "primary": [], "worker": []
        }  # fmt: skip
        for n in sizes:
            for concurrency in sorted({1, n}):
                worker = Worker(concurrency, workdir)
                try:
                    orchestrate(owner, n)  # warm the pool processes
                    for _ in range(args.rounds):
                        t = timeline(orchestrate(owner, n))
                        phases.setdefault((n, concurrency), []).append(t["phase_ms"])
                        if concurrency == n:
                            overheads["routing"].append(t["routing_overhead"])
                            overheads["support"].append(t["support_overhead"])
                            overheads["dispatch"].append(t["dispatch"])
                            overheads["collect"].append(t["collect"])
                            overheads["primary"].append(t["primary_overhead"])
                            overheads["worker"] += t["per_worker"]
                finally:
                    worker.stop()
        print("\nsupport phase, median over rounds (N workers, each one model call of the latency above):")
        print(f"{'N':>3} {'side by side (-c N)':>20} {'one after another (-c 1)':>25} {'speedup':>8} {'/ N':>6}")
        for n in sizes:
            side, seq = med(phases[(n, n)]), med(phases[(n, 1)])
            print(f"{n:>3} {side:>17.0f} ms {seq:>22.0f} ms {seq / side:>8.2f} {seq / side / n:>6.2f}")
        print("\nthe orchestration's own time beside the model time, median (side-by-side runs):")
        for step, values in overheads.items():
            label = LABELS.get(step, f"{step} step")
            spread = f"range {min(values):.1f} to {max(values):.1f}, {len(values)} runs"
            print(f"  {label:<42} {med(values):7.1f} ms  ({spread})")
        print(f"  support step per worker{'':<19} {med(overheads['support']) / max(sizes):7.1f} ms at N={max(sizes)}")
    finally:
        fake.stop()
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
