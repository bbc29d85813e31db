"""A pool process's first model calls, with and without the worker's start-up warming, in the same run.

    .venv/bin/python bench/first_model_call.py [--rounds 5] [--forks 10]

A Celery worker's parent imports the tasks (and with them `agents.providers`), then forks its pool
processes; each makes its model client on its first call, one per endpoint. At the worker's start
(`worker_init`, before the fork) `agents.providers.warm()` makes the process's one TLS context,
imports what the HTTP client imports on first use and reads the headers it sends, all of which every
pool process then inherits. Here a fresh parent process does the same: it imports the providers,
then calls `warm()`, or not, or (the code before) lets each client make its own TLS context, as
the `openai` client does by default; then it forks `--forks` children one after another, and each
times its first call to the `default` endpoint, then its first call to a second endpoint (a client
of its own, as for a profile with its own endpoint), against the fake OpenAI-compatible server
(tests/agents/fake_llm.py) in another process. The three kinds of parent alternate, `--rounds`
times. Printed: the median wall and CPU time (the calling thread's) of each first call, and of a
later call for reference.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.model_client import fake_server  # noqa: E402

PARENT = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import httpx2
from agents import providers
if sys.argv[2] == "before":  # as the openai client makes its HTTP client by default
    providers.tls = httpx2.create_ssl_context
if sys.argv[2] == "warm":
    providers.warm()
MESSAGES = [{"role": "user", "content": "Hello."}]

def call(endpoint):
    started, cpu = time.perf_counter(), time.thread_time()
    providers.openai_provider(endpoint).complete(model="m", messages=MESSAGES, tools=[])
    return (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000

for _ in range(int(sys.argv[3])):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        times = {"first": call("default"), "second endpoint": call("second"), "warm": call("default")}
        os.write(write, json.dumps(times).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        print(answer.read(), flush=True)
    os.waitpid(pid, 0)
"""


# The parents: each client its own TLS context (as the `openai` client makes its HTTP client by
# default: the code before), the process's one made at the first call, and made at the worker's start.
KINDS = {"own TLS context": "before", "shared, not warmed": "cold", "warmed at start": "warm"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forks", type=int, default=10, help="pool processes forked per parent")
    args = parser.parse_args()

    with fake_server() as url:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": url,
            "OPENAI_API_KEY": "not-needed",
            "AGORA_ENDPOINT_SECOND_BASE_URL": url,
        }
        found: dict[str, dict[str, list[tuple[float, float]]]] = {kind: {} for kind in KINDS}
        for round_ in range(1, args.rounds + 1):
            for kind, argument in KINDS.items():
                out = subprocess.run(
                    [sys.executable, "-c", PARENT, str(BASE_DIR), argument, str(args.forks)],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                for line in out.stdout.splitlines():
                    for call, (wall, cpu) in json.loads(line).items():
                        found[kind].setdefault(call, []).append((wall, cpu))
            print(f"round {round_} of {args.rounds} done", flush=True)
        print(f"\nmedian over {args.rounds} parents x {args.forks} forked pool processes each, ms wall / CPU:")
        print(f"  {'':28}" + "".join(f"{kind:>22}" for kind in KINDS))
        for call in ("first", "second endpoint", "warm"):
            cells = []
            for kind in KINDS:
                walls, cpus = zip(*found[kind][call], strict=True)
                cells.append(f"{statistics.median(walls):8.2f} / {statistics.median(cpus):6.2f}")
            label = {"first": "first call", "second endpoint": "first call, second endpoint"}.get(call, "a later call")
            print(f"  {label:28}" + "".join(f"{cell:>22}" for cell in cells))


if __name__ == "__main__":
    main()
