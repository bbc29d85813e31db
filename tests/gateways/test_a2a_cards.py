"""Agent cards and who gets in: over a real daphne, with the SDK's client and plain HTTP."""

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from a2a.client import A2AClientError
from a2a.client.card_resolver import A2ACardResolver
from a2a.types import a2a_pb2 as pb

from accounts.actions import issue_token
from accounts.models import User
from sagas import actions
from tests.gateways.conftest import Cast, message, run, send
from tests.support import WebServer

pytestmark = pytest.mark.integration


def get(url: str, headers: dict[str, str] | None = None, body: Any = None) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read())


def test_an_exposed_agent_has_a_card_and_others_are_absent(web_server: WebServer, cast: Cast, alice: User) -> None:
    import asyncio

    import httpx

    async def resolve() -> pb.AgentCard:
        async with httpx.AsyncClient() as http:
            return await A2ACardResolver(http, cast.agent_url(web_server.url, "slow")).get_agent_card()

    card = asyncio.run(resolve())
    assert card.name == "slow"
    assert card.supported_interfaces[0].url == cast.agent_url(web_server.url, "slow")
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
    assert card.capabilities.streaming
    assert card.security_schemes["agoraKey"].http_auth_security_scheme.scheme == "Bearer"
    assert "Think" in card.skills[0].description

    card_path = ".well-known/agent-card.json"
    absent = get(cast.agent_url(web_server.url, "nobody") + card_path)
    hidden = get(cast.agent_url(web_server.url, "quiet") + card_path)
    assert absent[0] == hidden[0] == 404
    assert absent[2] == hidden[2] == {"type": "about:blank", "title": "Not found", "status": 404,
                                      "code": "not_found", "detail": "No such agent."}  # fmt: skip

    # A manager withdraws the agent: its card goes, and so does its endpoint.
    actions.set_exposed(saga=cast.saga, handle="agent:slow", exposed=False, by=alice)
    assert get(cast.agent_url(web_server.url, "slow") + card_path)[0] == 404
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "req-x"}}
    assert get(cast.agent_url(web_server.url, "slow"), {"Authorization": f"Bearer {cast.ext_token}"}, rpc)[:3:2] == (
        404, absent[2])  # fmt: skip


def test_calls_need_a_token_of_the_saga(web_server: WebServer, cast: Cast, alice: User, mallory: User) -> None:
    url = cast.agent_url(web_server.url, "slow")
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    status, headers, body = get(url, {}, rpc)
    assert (status, body["code"], headers["www-authenticate"]) == (401, "not_authenticated", 'Bearer realm="agora"')
    status, headers, body = get(url, {"Authorization": "Bearer not-a-token"}, rpc)
    assert (status, body["code"]) == (401, "not_authenticated")

    # mallory's agent in a saga of her own: a valid token, and yet the agent does not exist for it.
    other = actions.create_saga(title="Elsewhere", goal="", owner=mallory)
    _, outsider = actions.add_agent(saga=other, name="spy", role="Spy", task="Look", runtime="external", by=mallory)
    status, _, body = get(url, {"Authorization": f"Bearer {outsider}"}, rpc)
    assert (status, body["code"], body["detail"]) == (404, "not_found", "No such agent.")
    assert get(url, {"Authorization": f"Token {issue_token(user=mallory)}"}, rpc)[0] == 404

    # The SDK's client with ext's token gets in; a bad token is an error, never a task.
    task = run(url, cast.ext_token, lambda client: send(client, message("ping"), return_immediately=True))
    assert task.status.state == pb.TASK_STATE_SUBMITTED
    with pytest.raises(A2AClientError):
        run(url, "not-a-token", lambda client: send(client, message("ping"), return_immediately=True))


def test_the_hosts_card_and_the_public_address(redis_url: str, artifacts: Path, cast: Cast) -> None:
    """AGORA_A2A_HOST_AGENT may name an agent alone; AGORA_PUBLIC_URL is the address cards give."""
    env = {"AGORA_A2A_HOST_AGENT": "responder", "AGORA_PUBLIC_URL": "https://agora.example.com/"}
    server = WebServer(redis_url, artifacts, env=env)
    try:
        status, _, card = get(f"{server.url}/.well-known/agent-card.json")
        status_slow, _, slow = get(cast.agent_url(server.url, "slow") + ".well-known/agent-card.json")
    finally:
        server.stop()
    assert status == status_slow == 200
    assert card["name"] == "responder"
    assert card["supportedInterfaces"][0]["url"] == cast.agent_url("https://agora.example.com", "responder")
    assert slow["url"] == cast.agent_url("https://agora.example.com", "slow")  # the 0.3 field too
