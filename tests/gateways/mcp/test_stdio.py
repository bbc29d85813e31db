"""`manage.py mcp_server`: Agora's MCP server on stdin/stdout, one process per external agent."""

import subprocess
import sys
from collections.abc import Callable

import anyio
import pytest
from redis import Redis

from sagas.models import AgentRequest, Collaborator, HumanRequest, Run
from tests.gateways.mcp.conftest import Cast, data, error_code, stdio_client
from tests.support import BASE_DIR, child_env

pytestmark = pytest.mark.integration


def test_an_agent_works_entirely_through_stdio(redis_url: str, cast: Cast) -> None:
    waits_key = f"agora:waits:agent:{Collaborator.objects.get(saga=cast.saga, name='tester').pk}"

    async def scenario() -> str:
        # Caps set for this server process: one open request per sender, one wait in progress per agent.
        caps = {"AGORA_MAX_PENDING_PER_SENDER": "1", "AGORA_MAX_WAITS_PER_AGENT": "1"}
        async with stdio_client(redis_url, cast.tokens["tester"], **caps) as tester, \
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

            # While one long-poll is in progress, a second wait is refused, with the REST API's slots.
            async with anyio.create_task_group() as tg:
                tg.start_soon(tester.call_tool, "read_steering", {"after": response["seq"], "wait_s": 3})
                with Redis.from_url(redis_url) as redis:
                    await wait_for(lambda: redis.zcard(waits_key) == 1)
                ask = {"to": "agent:coder", "type": "t.run", "payload": [3], "mode": "wait"}
                assert error_code(await tester.call_tool("ask_agent", ask)) == "too_many_waits"

            form = {"title": "Ship it?", "fields": [{"name": "ok", "type": "boolean"}], "idempotency_key": "f-1"}
            asked_human = data(await tester.call_tool("ask_human", form))
            assert data(await tester.call_tool("ask_human", form)) == asked_human
            assert data(await tester.call_tool("finish", {}))["status"] == "completed"
            return str(asked_human["human_request_id"])

    form_id = anyio.run(scenario)
    assert HumanRequest.objects.get(pk=form_id).addressee.handle == "human:alice"
    assert AgentRequest.objects.get(saga=cast.saga).status == "completed"
    assert Run.objects.get(collaborator__name="tester").status == "completed"


async def wait_for(check: Callable[[], bool], timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


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
