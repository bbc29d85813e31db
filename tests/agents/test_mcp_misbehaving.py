"""An MCP server that answers what a tool result is not, goes away during a call or writes what
no column stores, and a model that writes arguments no decoder reads: each ends as a tool result
for the model and a journal entry, and the run goes on. An exception out of the turn would leave
the run `running` until its lease lapsed, and the next task would make the same call again, for
ever. The turns run here, in this process."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from accounts.models import User
from agents.executor import run_turn
from agents.mcp.actions import load_mcp_servers
from agents.mcp.models import McpServer
from journal.models import JournalEvent
from sagas import actions
from sagas.models import AgentRequest, Run, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.agents.test_runtime import tool_result
from tests.sagas.kernel import AddAgent

pytestmark = pytest.mark.django_db(transaction=True)

SERVER = str(Path(__file__).with_name("mcp_misbehaving_server.py"))


def misbehaving(monkeypatch: pytest.MonkeyPatch, *variables: str) -> None:
    for variable in variables:
        monkeypatch.setenv(variable, "1")
    load_mcp_servers(
        entries=[{"name": "odd", "transport": "stdio", "command": sys.executable, "args": [SERVER],
                  "env": {v: v for v in variables}, "allowed_tools": ["*"], "call_timeout_s": 10}]
    )  # fmt: skip


def until_settled(run_id: str) -> Run:
    for _ in range(5):  # a task's time slice may end after a call: the run is queued for the next task
        run_turn(run_id)
        run = Run.objects.get(pk=run_id)
        if run.status != Run.Status.QUEUED:
            return run
    raise AssertionError(f"run {run_id} still queued")


def call_once(add_internal: AddAgent, model_here: FakeLLM, call: dict[str, Any]) -> tuple[Run, Any]:
    model_here.script("m", say("", call), say("", tool_call("finish", {"result": "went on"}, "c-end")))
    agent = add_internal("ann", model="m", mcp_servers=["odd"], tools=["finish"])
    run = until_settled(agent.run.pk)
    assert (run.status, run.result) == (Run.Status.COMPLETED, "went on")
    _, second = model_here.calls_for("m")
    return run, tool_result(second, call["id"])


def calls(saga: Saga) -> list[dict[str, Any]]:
    return list(JournalEvent.objects.filter(saga=saga, type="mcp_call").values_list("data", flat=True))


@pytest.mark.parametrize(
    ("tool", "code", "outcome"),
    [("odd__badresult", "tool_error", "tool_error"), ("odd__die", "unavailable", "unavailable")],
    ids=["not a tool result", "gone during the call"],
)
def test_a_server_that_answers_no_tool_result_gives_a_tool_error(
    saga: Saga, add_internal: AddAgent, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch,
    tool: str, code: str, outcome: str,
) -> None:  # fmt: skip
    misbehaving(monkeypatch)

    _, result = call_once(add_internal, model_here, tool_call(tool, {}, "c1"))

    assert result["error"]["code"] == code, result
    assert [(c["tool"], c["outcome"]) for c in calls(saga)] == [(tool.removeprefix("odd__"), outcome)]


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "invalid_payload"),  # past the decoder's recursion
        ('{"a": ' + "[" * 100 + "]" * 100 + "}", "invalid_payload"),  # past AGORA_MAX_JSON_DEPTH
        ('{"a": ' + "1" * 5000 + "}", "invalid_arguments"),  # past Python's digits for an int
        ('{"a": "x\\u0000y"}', "invalid_payload"),  # a NUL, which no column stores
        ('{"a": NaN}', "invalid_arguments"),  # as for a built-in tool: not JSON
    ],
    ids=["recursion", "depth", "digits", "nul", "nan"],
)
def test_arguments_are_read_as_a_built_in_tools_are(
    saga: Saga, add_internal: AddAgent, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch,
    arguments: str, code: str,
) -> None:  # fmt: skip
    misbehaving(monkeypatch)

    _, result = call_once(add_internal, model_here, tool_call("odd__ok", arguments, "c1"))

    assert result["error"]["code"] == code, result  # refused before the server saw them
    assert [c["outcome"] for c in calls(saga)] == ["invalid"]


def test_what_the_server_writes_is_journaled_with_what_no_column_stores_replaced(
    saga: Saga, add_internal: AddAgent, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool's real name, journaled with its call, and the reason a connection failed: the
    server's own text. On PostgreSQL a NUL in either failed the turn's transaction."""
    misbehaving(monkeypatch, "MISBEHAVING_NUL_NAME")

    _, result = call_once(add_internal, model_here, tool_call("odd__x_y", {}, "c1"))  # offered with `_` for the NUL

    assert result == {"ok": True, "got": {}}
    assert [(c["tool"], c["outcome"]) for c in calls(saga)] == [("x\ufffdy", "ok")]


def test_a_refused_connection_is_journaled_with_its_reason_storable(
    saga: Saga, add_internal: AddAgent, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    misbehaving(monkeypatch, "MISBEHAVING_INIT_ERROR")
    model_here.script("m", say("", tool_call("finish", {"result": "without it"}, "c-end")))
    agent = add_internal("bea", model="m", mcp_servers=["odd"], tools=["finish"])

    assert until_settled(agent.run.pk).status == Run.Status.COMPLETED

    (event,) = JournalEvent.objects.filter(saga=saga, type="mcp_connect")
    assert event.data["servers"]["odd"]["status"] == "failed"
    assert "refused\ufffdhere" in event.data["servers"]["odd"]["reason"]


def test_a_task_that_starts_with_a_call_journals_its_connection(
    saga: Saga, add_internal: AddAgent, model_here: FakeLLM, monkeypatch: pytest.MonkeyPatch, alice: User
) -> None:
    """The call after a parked wait (or one cut short by a crash) is the first thing its task does:
    the connection it makes is journaled as the model call's would be (here: the server is gone)."""
    misbehaving(monkeypatch)
    peer, _ = actions.add_agent(saga=saga, name="peer", role="Peer", task="", runtime="external", by=alice)
    asking = tool_call("ask_agent", {"to": "agent:peer", "type": "q.x", "payload": {}, "mode": "wait"}, "c1")
    model_here.script("m", say("", asking, tool_call("odd__ok", {}, "c2")),
                      say("", tool_call("finish", {"result": "went on"}, "c-end")))  # fmt: skip
    agent = add_internal("cy", model="m", mcp_servers=["odd"], tools=["ask_agent", "finish"])
    assert until_settled(agent.run.pk).status == Run.Status.WAITING  # connected, asked, parked
    McpServer.objects.filter(name="odd").update(enabled=False)  # the server goes away meanwhile
    request = AgentRequest.objects.get(type="q.x")
    actions.reply_to_request(request_id=request.pk, by=peer.user, payload={"a": 1}, error=None)

    assert until_settled(agent.run.pk).status == Run.Status.COMPLETED

    reports = JournalEvent.objects.filter(saga=saga, type="mcp_connect").order_by("seq")
    assert [e.data["servers"]["odd"]["status"] for e in reports] == ["connected", "failed"]
    _, second = model_here.calls_for("m")
    assert tool_result(second, "c2")["error"]["code"] == "unknown_tool"
    assert json.loads(json.dumps(calls(saga)))[0]["outcome"] == "unknown_tool"
