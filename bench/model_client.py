"""The CPU one model call costs the calling process: the provider's call next to the typed call of
the `openai` client, against the same local server, in the same run.

    .venv/bin/python bench/model_client.py [--calls 300] [--rounds 3] [--tools 10]

A worker's turn calls its model through `agents.providers.OpenAICompatibleProvider`: the client's
`post` with the body and the answer as plain JSON. The baseline is the typed
`client.chat.completions.create` with the same messages and tools, whose answer is read the same
way. Both talk over HTTP to the fake OpenAI-compatible server (tests/agents/fake_llm.py), run in
another process so that its CPU is not counted; the messages are a worker's first turn (a system
prompt and a handoff of about 1 kB) and `--tools` tool schemas. Printed per round, then the median
of the rounds: the calling thread's CPU per call (`time.thread_time`, which other work on the
machine does not inflate as it does wall time) and wall time, and the ratio of the two CPUs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

SERVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.agents.fake_llm import FakeLLM, say
fake = FakeLLM()
fake.rule("m", lambda body: say('{"summary": "done", "progress": {"status": "completed"}}'))
print(fake.url, flush=True)
sys.stdin.read()  # until the benchmark closes it
"""


@contextmanager
def fake_server() -> Iterator[str]:
    """The fake OpenAI-compatible server in a process of its own (its CPU is not the caller's):
    its base URL, until the block ends."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(BASE_DIR)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield server.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=10)


def workload(tools: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages = [
        {"role": "system", "content": "You are a support worker in a team of agents. " * 15},
        {"role": "user", "content": json.dumps({"task": "Implement the endpoint with its tests. " * 25})},
    ]
    schemas = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "What the tool does, and when to use it. " * 4,
                "parameters": {
                    "type": "object",
                    "properties": {"to": {"type": "string", "description": "Whom."}, "payload": {"type": "object"}},
                    "required": ["to"],
                },
            },
        }
        for i in range(tools)
    ]
    return messages, schemas


def timed(call: Callable[[], str], calls: int) -> tuple[float, float]:
    """Median CPU and wall milliseconds per call."""
    call()  # a connection, the client's first-use costs
    cpu, wall = [], []
    for _ in range(calls):
        started, cpu_started = time.perf_counter(), time.thread_time()
        assert call() == '{"summary": "done", "progress": {"status": "completed"}}'
        cpu.append(time.thread_time() - cpu_started)
        wall.append(time.perf_counter() - started)
    return statistics.median(cpu) * 1000, statistics.median(wall) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls timed per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tools", type=int, default=10, help="tool schemas sent with each call")
    args = parser.parse_args()

    from agents.providers import OpenAICompatibleProvider

    with fake_server() as url:
        os.environ.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="not-needed")
        provider = OpenAICompatibleProvider("default")
        messages, tools = workload(args.tools)

        def typed() -> str:
            answer = provider.client.chat.completions.create(model="m", messages=messages, tools=tools)  # type: ignore[arg-type]
            return answer.choices[0].message.content or ""

        def plain() -> str:
            return provider.complete(model="m", messages=messages, tools=tools).content

        rows = []
        for round_ in range(1, args.rounds + 1):
            (typed_cpu, typed_wall), (plain_cpu, plain_wall) = timed(typed, args.calls), timed(plain, args.calls)
            rows.append((typed_cpu, typed_wall, plain_cpu, plain_wall))
            print(
                f"round {round_}: typed create() {typed_cpu:.2f} ms CPU ({typed_wall:.2f} wall), "
                f"provider {plain_cpu:.2f} ms CPU ({plain_wall:.2f} wall)"
            )
        typed_cpu, typed_wall, plain_cpu, plain_wall = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"\nper call, median of {args.rounds} rounds x {args.calls} calls, {args.tools} tools:")
        print(f"  typed chat.completions.create(): {typed_cpu:6.2f} ms CPU  {typed_wall:6.2f} ms wall")
        print(f"  the provider (client.post):      {plain_cpu:6.2f} ms CPU  {plain_wall:6.2f} ms wall")
        print(f"  CPU saved per call: {typed_cpu - plain_cpu:.2f} ms ({typed_cpu / plain_cpu:.1f}x less)")


if __name__ == "__main__":
    main()
