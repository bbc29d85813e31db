"""`manage.py mcp_server`: Agora's MCP server on stdin/stdout, one process per external agent."""

import subprocess
import sys

import anyio
import pytest

from sagas.models import AgentRequest, HumanRequest, Run
from tests.gateways.mcp.conftest import Cast, data, error_code, stdio_client
from tests.support import BASE_DIR, child_env

pytestmark = pytest.mark.integration


def test_an_agent_works_entirely_through_stdio(redis_url: str, cast: Cast) -> None:
    async def scenario() -> str:
        # A cap set for this server process: one open request per sender.
        async with stdio_client(redis_url, cast.tokens["tester"], AGORA_MAX_PENDING_PER_SENDER="1") as tester, \
                stdio_client(redis_url, cast.tokens["coder"]) as coder:  # fmt: skip
            asked = data(await tester.call_tool("ask_agent", {"to": "agent:coder", "type": "t.run", "payload": [1]}))
            more = await tester.call_tool("ask_agent", {"to": "agent:coder", "type": "t.run", "payload": [2]})
            assert error_code(more) == "too_many_pending"

            inbox = data(await coder.call_tool("read_steering", {"wait_s": 5}))
            assert [(i["kind"], i["request_id"]) for i in inbox["items"]] == [("request", asked["request_id"])]
            # Only the recipient replies.
            assert error_code(await tester.call_tool("reply", {"request_id": asked["request_id"], "payload": 1}))
            assert data(await coder.call_tool("reply", {"request_id": asked["request_id"], "payload": {"r": 3}}))
            # Acknowledged by the cursor: nothing new after it.
            assert data(await coder.call_tool("read_steering", {"after": inbox["cursor"]}))["items"] == []

            response = data(await tester.call_tool("read_steering", {"after": 0, "wait_s": 5}))["items"][0]
            assert (response["kind"], response["status"], response["payload"]) == ("response", "completed", {"r": 3})

            form = {"title": "Ship it?", "fields": [{"name": "ok", "type": "boolean"}], "idempotency_key": "f-1"}
            asked_human = data(await tester.call_tool("ask_human", form))
            assert data(await tester.call_tool("ask_human", form)) == asked_human
            assert data(await tester.call_tool("finish", {}))["status"] == "completed"
            return str(asked_human["human_request_id"])

    form_id = anyio.run(scenario)
    assert HumanRequest.objects.get(pk=form_id).addressee.handle == "human:alice"
    assert AgentRequest.objects.get(saga=cast.saga).status == "completed"
    assert Run.objects.get(collaborator__name="tester").status == "completed"


def test_the_server_will_not_start_without_an_agents_token(redis_url: str, cast: Cast) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "mcp_server"],
        cwd=BASE_DIR,
        env=child_env(redis_url, AGORA_TOKEN="agt_nothing"),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0
    assert b"Invalid or missing API token" in result.stderr
    assert result.stdout == b""
