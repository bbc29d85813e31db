"""Agents use tools from MCP servers: a small server on the same SDK (tests/agents/mcp_tools_server.py),
over stdio and streamable HTTP, called by a real Celery worker's turns."""

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.mcp.actions import load_mcp_servers
from sagas.models import Collaborator, Run, Saga
from sagas.tasks import reconcile
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.agents.test_runtime import tool_result
from tests.sagas.kernel import AddAgent, events_of, finished
from tests.support import BASE_DIR, CeleryWorker, free_port, stop_process, wait_until

SERVER = str(Path(__file__).with_name("mcp_tools_server.py"))
ENV = {"MCP_TEST_LOG": "MCP_TEST_LOG", "MCP_TEST_GATE": "MCP_TEST_GATE"}


@pytest.fixture
def calls_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


@pytest.fixture
def mcp_worker(
    transactional_db: None, redis_url: str, artifacts: Path, runtime_env: dict[str, str], calls_log: Path
) -> Iterator[CeleryWorker]:
    """A worker whose environment holds what the servers' rows refer to by name; one pool process,
    so that a run's next task finds the connections its last one left (they are per process)."""
    env = {**runtime_env, "MCP_TEST_LOG": str(calls_log), "MCP_TEST_GATE": str(calls_log) + ".gate",
           "MCP_TEST_TOKEN": "s3cret"}  # fmt: skip
    started = CeleryWorker(redis_url, artifacts, env=env, concurrency=1)
    yield started
    started.kill()


def stdio_server(name: str = "tools", **options: Any) -> dict[str, Any]:
    return {"name": name, "transport": "stdio", "command": sys.executable, "args": [SERVER], "env": ENV,
            "allowed_tools": ["echo", "add", "fail", "hang", "pid", "mark", "block"], **options}  # fmt: skip


def test_tools_are_offered_called_and_their_failures_returned_as_tool_errors(
    mcp_worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    load_mcp_servers(
        entries=[
            stdio_server(call_timeout_s=1.5),
            {"name": "broken", "transport": "stdio", "command": "/nonexistent/mcp-server", "allowed_tools": ["*"]},
        ]
    )
    fake_llm.script(
        "m",
        say(
            "",
            tool_call("tools__echo", {"text": "hi"}, "c1"),
            tool_call("tools__add", {"a": 2, "b": 3}, "c2"),
            tool_call("tools__fail", {}, "c3"),
            tool_call("tools__hang", {"seconds": 30}, "c4"),
            tool_call("tools__secret", {}, "c5"),
            tool_call("tools__pid", {}, "c6"),
        ),
        say("", tool_call("get_collaborators", {}, "c7"), tool_call("tools__pid", {}, "c8")),
        say("", tool_call("finish", {"result": "done"}, "c9")),
    )
    ann = add_internal("ann", model="m", mcp_servers=["tools", "broken"])

    run = wait_until(lambda: finished(ann), timeout=60, what="ann's run to finish")

    assert run.status == Run.Status.COMPLETED, run.error
    first, second, third = fake_llm.calls_for("m")
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert {"tools__echo", "tools__add", "tools__fail", "tools__hang", "tools__pid"} <= set(offered)
    assert "tools__secret" not in offered  # not allowed: never offered
    assert not any(name.startswith("broken__") for name in offered)
    assert offered["tools__add"]["parameters"]["properties"].keys() == {"a", "b"}
    assert tool_result(second, "c1") == {"result": "hi"}
    assert tool_result(second, "c2") == {"sum": 5}
    assert tool_result(second, "c3")["error"]["code"] == "tool_error"
    assert "broken on purpose" in json.dumps(tool_result(second, "c3"))
    assert tool_result(second, "c4")["error"]["code"] == "timeout"
    assert tool_result(second, "c5")["error"]["code"] == "unknown_tool"
    # The connection made in the first turn served the second one too: the same server process.
    server_pid = tool_result(second, "c6")["result"]
    assert tool_result(third, "c8")["result"] == server_pid
    assert "collaborators" in tool_result(third, "c7")

    (connect,) = events_of(saga, "mcp_connect")
    assert connect.data["servers"]["tools"]["status"] == "connected"
    assert connect.data["servers"]["broken"]["status"] == "failed" and connect.data["servers"]["broken"]["reason"]
    calls = [(e.data["tool"], e.data["outcome"]) for e in events_of(saga, "mcp_call")]
    assert calls == [("echo", "ok"), ("add", "ok"), ("fail", "tool_error"), ("hang", "timeout"),
                     ("tools__secret", "unknown_tool"), ("pid", "ok"), ("pid", "ok")]  # fmt: skip
    echo = events_of(saga, "mcp_call")[0].data
    assert echo["server"] == "tools" and echo["duration_ms"] >= 0 and echo["result_bytes"] == len('{"result": "hi"}')
    # The run ended: its connection was closed, and the stdio server with it.
    wait_until(lambda: not alive(server_pid), what="the stdio server to exit")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone too
        return stat.read().split()[2] != "Z"


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_a_streamable_http_server_gets_its_credentials_from_the_environment(
    mcp_worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga, artifacts: Path
) -> None:
    port = free_port()
    log = (artifacts / "http-server.log").open("ab")
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], cwd=BASE_DIR, stdout=log, stderr=log,
                            start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: listening(port), timeout=30, what="the HTTP MCP server")
        load_mcp_servers(
            entries=[
                {"name": "web", "transport": "http", "url": f"http://127.0.0.1:{port}/mcp", "allowed_tools": ["*"],
                 "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}},
            ]
        )  # fmt: skip
        fake_llm.script(
            "m",
            say("", tool_call("web__whoami", {}, "c1"), tool_call("web__echo", {"text": "over http"}, "c2")),
            say("", tool_call("finish", {"result": "done"}, "c3")),
        )
        ann = add_internal("ann", model="m", mcp_servers=["web"])
        run = wait_until(lambda: finished(ann), timeout=60, what="ann's run to finish")
    finally:
        stop_process(proc)
        log.close()

    assert run.status == Run.Status.COMPLETED, run.error
    _, second = fake_llm.calls_for("m")
    assert tool_result(second, "c1") == {"result": "Bearer s3cret"}
    assert tool_result(second, "c2") == {"result": "over http"}
    assert [e.data["outcome"] for e in events_of(saga, "mcp_call")] == ["ok", "ok"]


def test_a_worker_killed_during_an_mcp_call_does_not_repeat_the_completed_one(
    mcp_worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga, calls_log: Path
) -> None:
    load_mcp_servers(entries=[stdio_server()])
    fake_llm.script(
        "m",
        say("", tool_call("tools__mark", {"label": "a"}, "c1"), tool_call("tools__block", {"label": "b"}, "c2")),
        say("", tool_call("finish", {"result": "survived"}, "c3")),
    )
    ann: Collaborator = add_internal("ann", model="m", mcp_servers=["tools"])
    wait_until(lambda: calls_log.exists() and "block b" in calls_log.read_text(), timeout=60, what="the block call")

    mcp_worker.kill()  # during `block`: `mark` completed and its result is stored
    Path(str(calls_log) + ".gate").touch()
    mcp_worker.start()

    def recovered() -> Run | None:
        reconcile()  # what beat does: the lapsed lease is reclaimed
        return finished(ann)

    run = wait_until(recovered, timeout=60, interval=0.5, what="ann's run to recover and finish")

    assert run.status == Run.Status.COMPLETED and run.result == "survived"
    lines = calls_log.read_text().splitlines()
    assert lines.count("mark a") == 1  # the completed call was not made again
    assert lines.count("block b") == 2  # the one cut short was
    (_, last) = fake_llm.calls_for("m")
    assert tool_result(last, "c1") == {"result": "marked a"}
    assert tool_result(last, "c2") == {"result": "unblocked b"}
    assert [e.data["tool"] for e in events_of(saga, "mcp_call")] == ["mark", "block"]
