"""The orchestrator's parallel speedup and its own overhead, through the real stack.

    .venv/bin/python bench/orchestration.py [--workers 1,2,4] [--latency 1.0] [--rounds 3]
                                            [--postgres] [--against REV]

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
`prompt.completed`), and per worker (its `worker_start` → `worker_end`, minus its model call), over
all runs and at each N (N pool processes on fewer cores finish their calls at the same instant and
wait for each other's CPU).

The counts do not depend on the machine's load: the worker processes run with
`bench/orchestration_probe.py`, which records per task the SQL statements, the transactions
committed and the Celery messages sent, and the orchestration steps it ran. Per orchestration:
the tasks run (Celery hand-offs), messages sent, statements and transactions, and the steps tried
(a step tried and not moved on is a doorbell that found its work unfinished); per support worker,
the difference between the largest N and N = 1, divided by N - 1.

Last, the targets against this run's medians: the speedup at every N, and the ≤ 5 ms per worker
read both ways, as a worker's own time and as the support step's own time over N; and how much of
the support step at N = 1 is two kernel delegations with their claims (the worker's, measured from
`plan.created` to its `worker_start`, and the primary's, the same work) and the worker's own time.

`--against REV` runs the same rounds on a checkout of REV (a temporary git worktree) and on this
tree, interleaved (REV, this tree, REV, …), so that both see the same load; the orchestrations are
submitted by this tree's code in both cases, the workers run each tree's.

Needs nothing running: a temporary data dir with its own SQLite database (or, with `--postgres`, a
temporary database on the local PostgreSQL server), the embedded redis-server on a free port, its
worker processes; all removed at the end.
"""

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.journal_append import PG_SERVER, postgres_database  # noqa: E402
from tests.agents.fake_llm import FakeLLM, say, tool_call  # noqa: E402
from tests.support import RedisServer, stop_process, wait_until  # noqa: E402


def configure(workdir: Path, redis_base: str, llm_url: str, database_url: str) -> None:
    probe = workdir / "probe"
    probe.mkdir()
    # The probe as a top-level module, so that a worker of another checkout imports it too.
    shutil.copy(BASE_DIR / "bench" / "orchestration_probe.py", probe / "agora_bench_probe.py")
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        AGORA_DATA_DIR=str(workdir),
        DATABASE_URL=database_url,
        BENCH_PROBE_FILE=str(workdir / "probe.jsonl"),
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
    def __init__(self, concurrency: int, logdir: Path, tree: Path) -> None:
        from config.celery import app

        self.name = f"bench-{uuid.uuid4().hex[:8]}@localhost"
        argv = [sys.executable, "-m", "celery", "-A", "agora_bench_probe", "worker", "-n", self.name, "-l", "WARNING",
                "-P", "prefork", "-c", str(concurrency), "--without-mingle", "--without-gossip"]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(logdir / "probe"))
        with (logdir / f"worker-c{concurrency}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_until(lambda: bool(app.control.ping([self.name], timeout=0.3)), timeout=90, interval=0.2, what="worker")

    def stop(self) -> None:
        stop_process(self.proc, grace=5)


def orchestrate(owner: Any, n: int, probe: Path) -> tuple[Any, dict[str, Any]]:
    """One orchestration, and what its tasks did (the probe's lines written meanwhile)."""
    import agora_bench_probe

    from agents.orchestrator.actions import submit_prompt
    from agents.orchestrator.models import Prompt
    from sagas.actions import create_saga

    saga = create_saga(title=f"bench {uuid.uuid4().hex[:6]}", owner=owner)
    offset = probe.stat().st_size if probe.exists() else 0
    agora_bench_probe.snapshot()
    prompt, _ = submit_prompt(saga=saga, by=owner, text=f"Split this. WORKERS={n} ", brain="bench")
    submitted = agora_bench_probe.snapshot()
    # Every figure comes from the journal's timestamps: a faster poll measures nothing sooner, and
    # its queries would compete with the orchestration for the CPU and the database.
    wait_until(
        lambda: Prompt.objects.filter(pk=prompt.pk).exclude(status="running").exists(),
        timeout=120, interval=0.2, what="the orchestration",
    )  # fmt: skip
    prompt.refresh_from_db()
    if prompt.status != "completed":
        raise RuntimeError(f"orchestration {prompt.pk} {prompt.status}: {prompt.reason}")
    # The task that concluded it writes its line just after.
    wait_until(
        lambda: any(s["step"] == "primary" and s["moved"] for x in task_lines(probe, offset) for s in x["steps"]),
        timeout=10, what="the probe's line of the last step",
    )  # fmt: skip
    return prompt, tally(submitted, task_lines(probe, offset))


def task_lines(probe: Path, offset: int) -> list[dict[str, Any]]:
    with probe.open("rb") as f:
        f.seek(offset)
        # A line being written as we read has no newline yet: it is read next time.
        complete = f.read().decode().rpartition("\n")[0]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def tally(submitted: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One orchestration's counts: the submission (the web side) and every task it caused."""
    tasks: Counter[str] = Counter(short(line["task"]) for line in lines)
    sent: Counter[str] = Counter({short(k): v for k, v in submitted["published"].items()})
    steps: Counter[str] = Counter()
    for line in lines:
        sent.update({short(k): v for k, v in line["published"].items()})
        for step in line["steps"]:
            steps[f"{step['step']} {'moved' if step['moved'] else 'not ready'}"] += 1
            steps[f"statements in {step['step']}"] += step["statements"]
    return {
        "tasks": sum(tasks.values()),
        "messages": sum(sent.values()),
        "statements": submitted["statements"] + sum(line["statements"] for line in lines),
        "transactions": submitted["commits"] + sum(line["commits"] for line in lines),
        "submit statements": submitted["statements"],
        **{f"tasks {k}": v for k, v in tasks.items()},
        **{f"statements in {k} tasks": sum(x["statements"] for x in lines if short(x["task"]) == k) for k in tasks},
        **steps,
    }


def short(task: str) -> str:
    return task.rsplit(".", 1)[-1]


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
            slot.setdefault("call_ended", e.created_at.timestamp() * 1000)  # recorded as the call's answer is stored
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
        # The same in two parts: up to its model call, and from the call's answer to its worker_end.
        "worker_before": [w["call_ended"] - w["model_ms"] - w["worker_start"] for w in support if "call_ended" in w],
        "worker_after": [w["worker_end"] - w["call_ended"] for w in support if "call_ended" in w],
        # The support step's two doorbell hops: the workers' first turns start, the primary starts.
        "dispatch": min(w["worker_start"] for w in support) - at["plan.created"],
        "collect": primary_start - max(w["worker_end"] for w in support),
    }


LABELS = {
    "dispatch": "  of which plan.created → first worker_start",
    "collect": "  of which last worker_end → primary start",
    "worker": "per worker (worker_start → worker_end)",
    "worker_before": "  of which before its model call",
    "worker_after": "  of which after it, to worker_end",
}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4", help="support workers per orchestration, comma-separated")
    parser.add_argument("--latency", type=float, default=1.0, help="each support worker's model latency, seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", action="store_true", help=f"a temporary database on {PG_SERVER}, not SQLite")
    parser.add_argument("--against", default="", help="also run the workers of this git revision, interleaved")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (the probe's lines) and say where")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.workers.split(",") if n})

    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-orch-"))
    redis = RedisServer(workdir / "redis")
    fake = FakeLLM()
    cleanup = ExitStack()
    trees = [("this tree", BASE_DIR)]
    try:
        if args.against:
            before = workdir / "before"
            subprocess.run(["git", "worktree", "add", "--detach", str(before), args.against], cwd=BASE_DIR,
                           check=True, capture_output=True)  # fmt: skip
            cleanup.callback(
                subprocess.run, ["git", "worktree", "remove", "--force", str(before)], cwd=BASE_DIR, capture_output=True
            )
            trees.insert(0, (f"before ({args.against})", before))
        if args.postgres:
            database_url = cleanup.enter_context(postgres_database())
            if database_url is None:
                raise SystemExit(f"PostgreSQL at {PG_SERVER} does not answer")
            database = "PostgreSQL (a temporary database)"
        else:
            database_url, database = f"sqlite:///{workdir / 'bench.sqlite3'}", "SQLite (WAL)"
        configure(workdir, redis.base_url, fake.url, database_url)
        sys.path.insert(0, str(workdir / "probe"))
        program(fake, max(sizes), args.latency)
        import django

        django.setup()
        import agora_bench_probe
        from django.core.management import call_command

        from accounts.models import User

        agora_bench_probe.install()
        call_command("migrate", verbosity=0)
        load(max(sizes))
        owner = User.objects.create_user(username="bench")
        print(f"{os.cpu_count()} cores; {database}; model latency {args.latency:.2f} s per support worker")
        print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
        probe = workdir / "probe.jsonl"
        results = {label: Results() for label, _ in trees}
        for _ in range(args.rounds):
            for label, tree in trees:
                for concurrency in sorted({1, *sizes}):
                    worker = Worker(concurrency, workdir, tree)
                    try:
                        orchestrate(owner, max(1, concurrency), probe)  # warm the pool processes
                        for n in sizes if concurrency == 1 else [concurrency]:
                            prompt, counts = orchestrate(owner, n, probe)
                            results[label].add(n, concurrency, timeline(prompt), counts)
                    finally:
                        worker.stop()
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
        for label, _ in trees:
            print(f"\n=== {label}")
            results[label].report(sizes)
    finally:
        fake.stop()
        redis.stop()
        cleanup.close()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


class Results:
    def __init__(self) -> None:
        self.phases: dict[tuple[int, int], list[float]] = {}
        self.overheads: dict[str, list[float]] = {
            "routing": [], "support": [], "dispatch": [], "collect": [], "primary": [], "worker": [],
            "worker_before": [], "worker_after": [],
        }  # fmt: skip
        self.support_per_worker: dict[int, list[float]] = {}  # by N
        self.worker_by_n: dict[int, list[float]] = {}  # per worker, by N
        self.dispatch_by_n: dict[int, list[float]] = {}  # the delegation of the workers with a first claim, by N
        self.counts: dict[int, list[dict[str, Any]]] = {}

    def add(self, n: int, concurrency: int, t: dict[str, Any], counts: dict[str, Any]) -> None:
        self.phases.setdefault((n, concurrency), []).append(t["phase_ms"])
        self.counts.setdefault(n, []).append(counts)
        if concurrency == n:
            for step in ("routing", "support", "primary"):
                self.overheads[step].append(t[f"{step}_overhead"])
            for step in ("dispatch", "collect"):
                self.overheads[step].append(t[step])
            self.overheads["worker"] += t["per_worker"]
            self.overheads["worker_before"] += t["worker_before"]
            self.overheads["worker_after"] += t["worker_after"]
            self.worker_by_n.setdefault(n, []).extend(t["per_worker"])
            self.dispatch_by_n.setdefault(n, []).append(t["dispatch"])
            self.support_per_worker.setdefault(n, []).append(t["support_overhead"] / n)

    def report(self, sizes: list[int]) -> None:
        print("support phase, median over rounds (N workers, each one model call of the latency above):")
        print(f"{'N':>3} {'side by side (-c N)':>20} {'one after another (-c 1)':>25} {'speedup':>8} {'/ N':>6}")
        for n in sizes:
            side, seq = med(self.phases[(n, n)]), med(self.phases[(n, 1)])
            print(f"{n:>3} {side:>17.0f} ms {seq:>22.0f} ms {seq / side:>8.2f} {seq / side / n:>6.2f}")
        print("the orchestration's own time beside the model time, median (side-by-side runs):")
        for step, values in self.overheads.items():
            label = LABELS.get(step, f"{step} step")
            spread = f"range {min(values):.1f} to {max(values):.1f}, {len(values)} runs"
            print(f"  {label:<42} {med(values):7.1f} ms  ({spread})")
        for n, values in sorted(self.worker_by_n.items()):
            print(f"  per worker, at N = {n}{'':<23} {med(values):7.1f} ms")
        for n, values in sorted(self.support_per_worker.items()):
            print(f"  support step / N, at N = {n}{'':<17} {med(values):7.1f} ms")
        print("counts per orchestration (median over its runs; they do not depend on the load):")
        keys = sorted({k for runs in self.counts.values() for c in runs for k in c}, key=count_order)
        print(f"  {'':<38}" + "".join(f"{'N=' + str(n):>8}" for n in sizes) + f"{'/ worker':>10}")
        for key in keys:
            values = [med([float(c.get(key, 0)) for c in self.counts[n]]) for n in sizes]
            marginal = (values[-1] - values[0]) / (sizes[-1] - sizes[0]) if len(sizes) > 1 else float("nan")
            print(f"  {key:<38}" + "".join(f"{v:>8.0f}" for v in values) + f"{marginal:>10.1f}")
        self.verdicts(sizes)

    def verdicts(self, sizes: list[int]) -> None:
        """The issue's targets against this run's medians, read both ways the second one can be:
        a worker's own time, and the support step's own time shared among its workers."""
        speedups = {n: med(self.phases[(n, 1)]) / med(self.phases[(n, n)]) / n for n in sizes}
        checks = [
            (f"speedup >= 0.8 x N: {' / '.join(f'{v:.2f}' for v in speedups.values())}",
             all(v >= 0.8 for v in speedups.values())),
            (f"per worker <= 5 ms: {' / '.join(f'{med(self.worker_by_n[n]):.1f}' for n in sizes)} ms",
             all(med(self.worker_by_n[n]) <= 5 for n in sizes)),
            (f"support step / N <= 5 ms: {' / '.join(f'{med(self.support_per_worker[n]):.1f}' for n in sizes)} ms",
             all(med(self.support_per_worker[n]) <= 5 for n in sizes)),
        ]  # fmt: skip
        print(f"targets, at N = {' / '.join(map(str, sizes))}:")
        for label, met in checks:
            print(f"  {'met    ' if met else 'NOT met'}  {label}")
        if 1 in sizes:
            # At N = 1 the support step is mostly two kernel delegations with their claims (the worker's,
            # which `dispatch` measures, and the primary's, the same work) and the worker's own time.
            parts = 2 * med(self.dispatch_by_n[1]) + med(self.worker_by_n[1])
            step = med(self.support_per_worker[1])
            print(f"  at N = 1, two delegations with their claims and a worker's own time: {parts:.1f} of the "
                  f"support step's {step:.1f} ms")  # fmt: skip


def count_order(key: str) -> tuple[int, str]:
    first = ["tasks", "messages", "transactions", "statements", "submit statements"]
    return (first.index(key), "") if key in first else (len(first) + key.startswith("statements"), key)


if __name__ == "__main__":
    main()
