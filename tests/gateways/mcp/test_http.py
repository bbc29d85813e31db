"""Agora's MCP server over streamable HTTP, mounted in the real ASGI app under daphne."""

import http.client
import json
import threading
import time
from typing import Any, cast
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from django.db import connection

from accounts.models import User
from journal.models import JournalEvent
from sagas import actions
from sagas.models import AgentRequest
from tests.gateways.mcp.conftest import Cast, data, error_code, http_client
from tests.support import WebServer, wait_until

pytestmark = pytest.mark.integration


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


TOOLS = {"get_collaborators", "ask_agent", "reply", "read_steering", "cancel_request", "ask_human", "finish"}


def test_two_agents_exchange_a_request_and_its_reply_inside_a_saga(web_server: WebServer, cast: Cast) -> None:
    async def scenario() -> dict[str, object]:
        async with (
            http_client(web_server.url, cast.tokens["coder"]) as coder,
            http_client(web_server.url, cast.tokens["tester"]) as tester,
        ):
            assert {tool.name for tool in (await tester.list_tools()).tools} == TOOLS
            seen = data(await tester.call_tool("get_collaborators", {}))["collaborators"]
            assert {c["id"] for c in seen} >= {"agent:coder", "agent:tester", "human:alice"}

            async def answer() -> None:
                inbox = data(await coder.call_tool("read_steering", {"after": 0, "wait_s": 20}))
                (item,) = inbox["items"]
                assert (item["kind"], item["from"], item["type"]) == ("request", "agent:tester", "schema.review")
                replied = await coder.call_tool("reply", {"request_id": item["request_id"], "payload": {"ok": True}})
                assert data(replied)["status"] == "completed"
                # A second reply is refused as over REST.
                again = await coder.call_tool("reply", {"request_id": item["request_id"], "payload": {"ok": False}})
                assert error_code(again) == "already_answered"

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer)
                asked = await tester.call_tool(
                    "ask_agent",
                    {"to": "agent:coder", "type": "schema.review", "payload": {"v": 2}, "mode": "wait",
                     "timeout_s": 30},
                )  # fmt: skip
            outcome = data(asked)
            # The reply reached the waiting sender; it is in the sender's steering as well.
            inbox = data(await tester.call_tool("read_steering", {"after": 0}))
            assert [i["kind"] for i in inbox["items"]] == ["response"]
            assert inbox["cursor"] == inbox["items"][0]["seq"]
            return outcome

    outcome = anyio.run(scenario)
    assert outcome["status"] == "completed" and outcome["from"] == "agent:coder"
    assert outcome["payload"] == {"ok": True}
    request = AgentRequest.objects.get(pk=outcome["request_id"])
    assert (request.sender.handle, request.recipient.handle, request.status) == (
        "agent:tester",
        "agent:coder",
        "completed",
    )
    events = [(e.type, e.actor) for e in JournalEvent.objects.for_saga(cast.saga.pk)]
    # The dashboard's live view is fed from these events.
    assert events[-2:] == [("request.created", "agent:tester"), ("request.completed", "agent:coder")]


def test_kernel_rules_hold_as_over_rest(web_server: WebServer, cast: Cast) -> None:
    async def scenario() -> None:
        async with (
            http_client(web_server.url, cast.tokens["tester"]) as tester,
            http_client(web_server.url, cast.tokens["spy"]) as spy,
        ):
            ask = {"to": "agent:coder", "type": "t.x", "payload": {"n": 1}, "idempotency_key": "k-1"}
            first = data(await tester.call_tool("ask_agent", ask))
            assert first["status"] == "pending"
            # Idempotency: the same key and body return the first request; another body is a conflict.
            assert data(await tester.call_tool("ask_agent", ask))["request_id"] == first["request_id"]
            conflict = await tester.call_tool("ask_agent", {**ask, "payload": {"n": 2}})
            assert error_code(conflict) == "idempotency_conflict"
            # Access: an agent of another saga cannot reach coder, nor read or cancel tester's request.
            assert error_code(await spy.call_tool("ask_agent", {**ask, "idempotency_key": ""})) == "not_found"
            assert error_code(await spy.call_tool("cancel_request", {"request_id": first["request_id"]})) == "not_found"
            # Caps: a payload over the limit is refused whole.
            big = {**ask, "idempotency_key": "", "payload": {"blob": "x" * 300_000}}
            assert error_code(await tester.call_tool("ask_agent", big)) == "payload_too_large"
            # What no database stores is refused as over REST, on every database.
            for payload in ({"note": "a\x00b"}, nested(100)):
                refused = await tester.call_tool("ask_agent", {**ask, "idempotency_key": "", "payload": payload})
                assert error_code(refused) == "invalid_payload"
            # A wait that passes its timeout says so; the request stays open for a later reply.
            wait = {"to": "agent:coder", "type": "t.y", "payload": {}, "mode": "wait", "timeout_s": 0.5}
            waited = data(await tester.call_tool("ask_agent", wait))
            assert (waited["status"], waited["timed_out"]) == ("pending", True)
            cancelled = data(await tester.call_tool("cancel_request", {"request_id": first["request_id"]}))
            assert cancelled["status"] == "cancelled"

    anyio.run(scenario)
    assert sorted(AgentRequest.objects.filter(saga=cast.saga).values_list("type", "status")) == [
        ("t.x", "cancelled"),
        ("t.y", "pending"),
    ]

    # A wait of NaN seconds is refused at once (it compared false with every deadline: it never ended).
    parts = urlsplit(web_server.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    call = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_steering", "arguments": '
    conn.request("POST", "/mcp", body=call + b'{"wait_s": NaN}}}', headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18", "Authorization": f"Bearer {cast.tokens['tester']}",
    })  # fmt: skip
    answer = json.loads(conn.getresponse().read())
    conn.close()
    assert answer["result"]["isError"] is True and "wait_s" in answer["result"]["content"][0]["text"]

    # A GET (a stream for messages from the server, which sends none) is refused at once, and a body
    # past the limit before it is read whole.
    bearer = {"Authorization": f"Bearer {cast.tokens['tester']}", "Accept": "application/json, text/event-stream"}
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("GET", "/mcp", headers=bearer)
    assert conn.getresponse().status == 405
    conn.close()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("POST", "/mcp", body=call + b'{"wait_s": 0, "pad": "' + b"x" * 400_000 + b'"}}}',
                 headers={"Content-Type": "application/json", **bearer})  # fmt: skip
    too_large = conn.getresponse()
    assert too_large.status == 413 and json.loads(too_large.read())["code"] == "payload_too_large"
    conn.close()

    # Authentication: a call without an agent's valid API token is refused before any tool runs.
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
        conn.request("POST", "/mcp", body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        assert response.status == 401, response.read()
        assert response.getheader("www-authenticate", "").startswith("Bearer")
        conn.close()


def test_a_wait_ends_once_its_token_is_revoked(web_server: WebServer, cast: Cast, alice: User) -> None:
    """As a REST long-poll does: each re-check looks for the token; the reply that comes after is not
    the revoked caller's to read."""

    def revoke_once_waiting() -> None:
        try:
            wait_until(lambda: AgentRequest.objects.filter(type="t.wait").exists(), timeout=30, what="the wait")
            actions.revoke_agent_token(saga=cast.saga, handle="agent:tester", by=alice)
        finally:
            connection.close()

    async def scenario() -> Any:
        async with http_client(web_server.url, cast.tokens["tester"]) as tester:
            wait = {"to": "agent:coder", "type": "t.wait", "payload": {}, "mode": "wait", "timeout_s": 60}
            return await tester.call_tool("ask_agent", wait)

    revoker = threading.Thread(target=revoke_once_waiting)
    revoker.start()
    try:
        started = time.monotonic()
        answer = anyio.run(scenario)
    finally:
        revoker.join(timeout=30)
    assert error_code(answer) == "authentication_failed" and time.monotonic() - started < 30


async def test_a_crash_in_the_endpoint_is_answered_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: a crash before any answer is the endpoint's JSON error, not the server's text page."""
    from gateways.mcp import http as endpoint

    def crash(key: str) -> bool:
        raise RuntimeError("secret detail that must not leak")

    monkeypatch.setattr(endpoint, "authenticated", crash)
    transport = httpx.ASGITransport(app=cast(Any, endpoint.McpEndpoint()), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        answer = await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert (answer.status_code, answer.json()["error"]) == (500, "server_error")
    assert b"secret" not in answer.content
