"""Outbound A2A with private addresses refused: every request the client makes is screened, the
messages' address that the remote agent's card names included, not only the URL a manager allowed."""

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import a2a_pb2 as pb
from django.conf import LazySettings

from gateways.a2a import outbound, public_net
from sagas.remotes import RemoteCall

TOKEN_ENV = "AGORA_TEST_SCREEN_TOKEN"


class Recorder(BaseHTTPRequestHandler):
    """A local HTTP server that serves `card` on GET and answers any POST with a completed task,
    recording each request's path and Authorization header in `seen`."""

    card = b""
    seen: list[tuple[str, str, str | None]] = []

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        self.answer(self.card)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        task = {"id": "t-1", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}
        self.answer(json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": {"task": task}}).encode())

    def answer(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None: ...


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, type[Recorder]]]:
    """A "public" remote agent whose card names a "private" server as its messages' address. Both
    are on loopback: the "public" one listens on 127.0.0.2, the one address a connection may be
    made to (public_net), and the tests tell their URLs apart for the check before each request."""
    monkeypatch.setattr(public_net, "is_public", lambda address: address == "127.0.0.2")

    class Private(Recorder):
        seen: list[tuple[str, str, str | None]] = []

    class Public(Recorder):
        seen: list[tuple[str, str, str | None]] = []

    private_handler, public_handler = Private, Public
    private = ThreadingHTTPServer(("127.0.0.1", 0), private_handler)
    public = ThreadingHTTPServer(("127.0.0.2", 0), public_handler)
    private_url = f"http://127.0.0.1:{private.server_port}/admin/"
    public_url = f"http://127.0.0.2:{public.server_port}/agent/"
    interface = pb.AgentInterface(url=private_url, protocol_binding="JSONRPC", protocol_version="1.0")
    card = pb.AgentCard(name="evil", description="d", version="1", supported_interfaces=[interface])
    public_handler.card = json.dumps(agent_card_to_dict(card)).encode()
    for server in (private, public):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield public_url, private_url, private_handler
    for server in (private, public):
        server.shutdown()
        server.server_close()


def test_a_card_naming_a_private_address_is_refused_before_anything_is_sent_there(
    servers: tuple[str, str, type[Recorder]], settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    public_url, private_url, private = servers
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = False

    async def public_only(url: str) -> bool:  # both listen on loopback: the public one is told apart
        return url.startswith(public_url)

    monkeypatch.setattr(outbound, "validate_push_notification_url", public_only)
    monkeypatch.setenv(TOKEN_ENV, "the-remote's-secret")
    call = RemoteCall(id="call-1", url=public_url, agent_name="evil", message="hi", task_id="")

    with pytest.raises(outbound.Refused) as refused:
        asyncio.run(outbound.exchange(call, TOKEN_ENV))

    assert refused.value.code == "remote_not_allowed" and private_url in str(refused.value)
    assert private.seen == []  # neither the message nor the bearer token reached it


def test_with_private_addresses_allowed_the_card_is_followed(
    servers: tuple[str, str, type[Recorder]], settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    public_url, _, private = servers
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = True  # a deployment whose remote agents live on its own network
    monkeypatch.setenv(TOKEN_ENV, "the-remote's-secret")
    call = RemoteCall(id="call-1", url=public_url, agent_name="evil", message="hi", task_id="")

    task = asyncio.run(outbound.exchange(call, TOKEN_ENV))

    assert task.status.state == pb.TaskState.TASK_STATE_COMPLETED
    assert private.seen == [("POST", "/admin/", "Bearer the-remote's-secret")]


def test_the_cancel_at_the_deadline_is_screened_too(
    servers: tuple[str, str, type[Recorder]], settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    public_url, _, private = servers
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = False

    async def public_only(url: str) -> bool:
        return url.startswith(public_url)

    monkeypatch.setattr(outbound, "validate_push_notification_url", public_only)
    monkeypatch.setenv(TOKEN_ENV, "the-remote's-secret")
    call = RemoteCall(id="call-1", url=public_url, agent_name="evil", message="hi", task_id="t-1")

    outbound.cancel_quietly(call, TOKEN_ENV)  # what the remote answers changes nothing: it only logs

    assert private.seen == []
