"""Two external agents of alice's saga that work through MCP (coder, and tester under it), and a
spy in mallory's unrelated saga. Each test drives Agora's MCP server with the SDK's own client."""

import json
import sys
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from accounts.models import User
from sagas import actions
from sagas.models import Saga
from tests.support import BASE_DIR, child_env


@dataclass
class Cast:
    saga: Saga
    tokens: dict[str, str]  # agent name → API token


@pytest.fixture
def cast(transactional_db: None, alice: User, mallory: User) -> Cast:
    saga = actions.create_saga(title="MCP", goal="Agents over MCP", owner=alice, policy=Saga.Policy.TREE)
    tokens = {}
    for name, parent in (("coder", None), ("tester", "agent:coder")):
        _, token = actions.add_agent(
            saga=saga, name=name, role=name.title(), task=f"{name}'s part", runtime="external", parent=parent, by=alice
        )
        assert token
        tokens[name] = token
    elsewhere = actions.create_saga(title="Elsewhere", goal="", owner=mallory)
    _, spy = actions.add_agent(saga=elsewhere, name="spy", role="Spy", task="", runtime="external", by=mallory)
    assert spy
    tokens["spy"] = spy
    return Cast(saga=saga, tokens=tokens)


def http_client(url: str, token: str) -> Client:
    transport = streamable_http_client(
        f"{url}/mcp", http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    )
    return Client(transport)


def stdio_client(redis_url: str, token: str, **env: str) -> Client:
    params = StdioServerParameters(
        command=sys.executable,
        args=[str(BASE_DIR / "manage.py"), "mcp_server"],
        env=child_env(redis_url, AGORA_TOKEN=token, **env),
        cwd=str(BASE_DIR),
    )
    return Client(params)


def data(result: CallToolResult) -> dict[str, Any]:
    """A successful call's JSON result."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    body: dict[str, Any] = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert body == result.structured_content
    return body


def error_code(result: CallToolResult) -> str:
    """A refused call's stable error code (the REST API's)."""
    assert result.is_error, result.content
    assert result.structured_content is not None
    code: str = result.structured_content["error"]["code"]
    return code
