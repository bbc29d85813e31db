"""The orchestrator connects the primary role's MCP servers before the primary runs and reports them
(the prompt's `mcp`); the primary gets their tools. A real Celery worker, the fake OpenAI-compatible
server, and the small MCP server of tests/agents/mcp_tools_server.py."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import User
from agents.actions import load_profiles
from agents.mcp.actions import load_mcp_servers
from agents.models import TranscriptEntry
from agents.orchestrator.actions import load_brains
from agents.orchestrator.models import Prompt
from journal.models import JournalEvent
from sagas.models import Collaborator, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call
from tests.agents.orchestration_support import settled, submit
from tests.agents.test_mcp import stdio_server
from tests.agents.test_runtime import tool_result
from tests.support import CeleryWorker


@pytest.fixture
def mcp_brain(transactional_db: None) -> None:
    """The coder (the primary) lists a working server and one that will not start; the tester lists none."""
    load_mcp_servers(
        entries=[
            stdio_server(),
            {"name": "broken", "transport": "stdio", "command": "/nonexistent/mcp-server", "allowed_tools": ["*"]},
        ]
    )
    load_profiles(
        entries=[
            {"name": "m-router", "role": "Router", "model": "router-m", "tools": ["finish"]},
            {"name": "m-coder", "role": "Coder", "model": "coder-m", "tools": ["finish"], "max_turns": 4,
             "mcp_servers": ["tools", "broken"]},
            {"name": "m-tester", "role": "Tester", "model": "tester-m", "tools": ["finish"], "max_turns": 4},
        ]
    )  # fmt: skip
    load_brains(
        entries=[
            {"name": "mcp", "planner_profile": "m-router", "roles": {"coder": "m-coder", "tester": "m-tester"},
             "signals": {"coder": ["implement"], "tester": [r"\btests?\b"]}, "default_primary": "coder",
             "review_by_default": False}
        ]
    )  # fmt: skip


def test_the_primary_gets_its_mcp_tools_and_the_prompt_reports_each_server(
    worker: CeleryWorker, fake_llm: FakeLLM, mcp_brain: None, saga: Saga, alice: User
) -> None:
    fake_llm.script("router-m", say("The coder, I think."))  # not JSON: the heuristic plan
    fake_llm.script("tester-m", say("All green."))
    fake_llm.script(
        "coder-m",
        say("", tool_call("tools__echo", {"text": "from the primary"}, "c1")),
        say("", tool_call("finish", {"result": "Implemented; the echo tool agreed."}, "c2")),
    )
    client = APIClient()
    client.force_authenticate(alice)

    started = submit(client, saga, prompt="Implement the cursor, with tests.", brain="mcp")
    body = settled(client, started["prompt_id"])

    assert body["status"] == "completed", body
    assert body["plan"]["primary_role"] == "coder" and [w["role"] for w in body["plan"]["workers"]] == ["tester"]
    report = body["mcp"]
    assert report.keys() == {"tools", "broken"}
    assert report["tools"]["status"] == "connected"
    assert {"tools__echo", "tools__add", "tools__pid"} <= set(report["tools"]["tools"])
    assert "tools__secret" not in report["tools"]["tools"]  # not allowed: not offered
    assert report["broken"]["status"] == "failed" and report["broken"]["reason"] and report["broken"]["tools"] == []
    assert Prompt.objects.get(pk=started["prompt_id"]).mcp == report

    # The primary was offered the working server's tools, called one, and saw its result.
    first, second = fake_llm.calls_for("coder-m")
    offered = {t["function"]["name"] for t in first["tools"]}
    assert set(report["tools"]["tools"]) <= offered and not any(n.startswith("broken__") for n in offered)
    assert tool_result(second, "c1") == {"result": "from the primary"}
    assert body["answer"] == "Implemented; the echo tool agreed."
    # A support worker whose profile lists no server is offered none.
    (tester_call,) = fake_llm.calls_for("tester-m")
    assert not any("__" in t["function"]["name"] for t in tester_call.get("tools", []))

    # The primary's transcript holds the call and its result.
    primary = Collaborator.objects.get(saga=saga, name=started["lead"].removeprefix("agent:") + ".primary")
    messages = [e.message for e in TranscriptEntry.objects.filter(run=primary.run).order_by("seq")]
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    assert calls == ["tools__echo", "finish"]
    echoed = next(m for m in messages if m["role"] == "tool" and m["tool_call_id"] == "c1")
    assert "from the primary" in echoed["content"]

    # Journaled by the lead before the primary started, then the primary's call.
    events = list(JournalEvent.objects.filter(saga=saga).order_by("seq"))
    (checked,) = [e for e in events if e.type == "mcp_connect" and e.actor == started["lead"]]
    assert checked.data["role"] == "coder" and checked.data["servers"] == report
    primary_start = next(e for e in events if e.type == "worker_start" and e.actor == f"agent:{primary.name}")
    assert checked.seq < primary_start.seq
    assert [(e.data["tool"], e.data["outcome"]) for e in events if e.type == "mcp_call"] == [("echo", "ok")]

    # The plan view shows one line per server.
    page = Client()
    page.force_login(alice)
    html = page.get(f"/sagas/{saga.pk}/live/prompts/").content.decode()
    assert 'data-mcp="tools" data-status="connected"' in html and "tools__echo" in html
    assert 'data-mcp="broken" data-status="failed"' in html and "not connected" in html
