"""Input the A2A gateway refuses before its dispatcher, through a real daphne: a body that is not
JSON or that no database stores, a method or a filter of the wrong type, a Host not allowed, a NUL
in the path. Each gets the protocol's error (HTTP 200, a JSON-RPC error) or a 400, never a 500, and
nothing is written. Last, in process, what a crash answers."""

import json
import socket
import uuid
from typing import Any

import httpx
import pytest
from django.conf import LazySettings

from gateways.a2a.models import PushConfig
from sagas.models import AgentRequest, SteeringItem
from tests.gateways.conftest import Cast
from tests.support import WebServer

pytestmark = pytest.mark.integration

V1 = {"A2A-Version": "1.0"}
SEND = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
BODIES: dict[str, tuple[bytes, int]] = {
    "bad UTF-8": (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "\xff\xfe"}}', -32700),
    "nested past the decoder": (b"[" * 100_000 + b"]" * 100_000, -32602),  # AGORA_MAX_JSON_DEPTH, as everywhere
    "NaN": (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": NaN}}', -32700),
    "a NUL in a text part": (
        b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m-nul", '
        b'"role": "ROLE_USER", "parts": [{"text": "a\\u0000b"}]}}}',
        -32602,
    ),
}


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def post(server: WebServer, cast: Cast, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        cast.agent_url(server.url, "slow"), content=body, timeout=30,
        headers={"Authorization": f"Bearer {cast.ext_token}", "Content-Type": "application/json", **(headers or {})},
    )  # fmt: skip


def rpc(method: Any, params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).encode()


def test_bodies_that_are_not_json_or_not_storable_get_the_protocols_errors(web_server: WebServer, cast: Cast) -> None:
    for name, (body, code) in BODIES.items():
        response = post(web_server, cast, body, V1)
        assert response.status_code == 200, (name, response.text[:300])
        assert response.json()["error"]["code"] == code, (name, response.json())
    assert not AgentRequest.objects.exists()


def test_a_method_or_a_filter_of_the_wrong_type_is_refused_not_a_server_error(
    web_server: WebServer, cast: Cast
) -> None:
    for body, headers in (
        (rpc(["SendMessage"], SEND), {}),  # no A2A-Version: the method name decides the version
        (rpc({"a": 1}, SEND), V1),
        (rpc("ListTasks", {"status": ["TASK_STATE_WORKING"]}), V1),
        (rpc("ListTasks", {"status": {}}), V1),
        # A filter refused before the dispatcher, in a call whose id JSON-RPC does not allow.
        *(
            (
                json.dumps(
                    {"jsonrpc": "2.0", "id": bad, "method": "ListTasks", "params": {"status": "bogus"}}
                ).encode(),
                V1,
            )
            for bad in ([1], {"a": 1}, 1.5, True)
        ),
    ):
        response = post(web_server, cast, body, headers)
        assert response.status_code == 200, response.text[:300]
        assert response.json()["error"]["code"] in (-32600, -32601, -32602), response.json()
    assert not AgentRequest.objects.exists()


def test_a_host_not_allowed_and_a_nul_in_the_path_are_refused(web_server: WebServer, cast: Cast) -> None:
    card_url = f"{cast.agent_url(web_server.url, 'slow')}.well-known/agent-card.json"
    assert httpx.get(card_url, timeout=30).status_code == 200
    evil = httpx.get(card_url, headers={"Host": "evil.example"}, timeout=30)
    assert evil.status_code == 400 and evil.json()["code"] == "invalid_host"
    nul = httpx.get(f"{web_server.url}/a2a/{cast.saga.pk}/sl%00ow/.well-known/agent-card.json", timeout=30)
    assert nul.status_code == 400 and nul.json()["code"] == "invalid_payload"
    assert post(web_server, cast, rpc("SendMessage", SEND), {**V1, "Host": "evil.example"}).status_code == 400
    assert not AgentRequest.objects.exists()
    # Two Host headers, an allowed one last: the check read the last, the card's URL the first.
    path = card_url.removeprefix(web_server.url)
    with socket.create_connection(("127.0.0.1", web_server.port), timeout=30) as raw:
        raw.sendall(f"GET {path} HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1:{web_server.port}\r\n"
                    "Connection: close\r\n\r\n".encode())  # fmt: skip
        answer = b"".join(iter(lambda: raw.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"invalid_host"' in answer and b"evil.example/" not in answer


def test_a_send_refused_for_its_webhook_or_its_message_id_creates_no_task(web_server: WebServer, cast: Cast) -> None:
    def send(message_id: str, parts: list[Any] | None = None, **configuration: Any) -> dict[str, Any]:
        params = {"message": {**SEND["message"], "messageId": message_id, "parts": parts or SEND["message"]["parts"]},
                  "configuration": {"returnImmediately": True, **configuration}}  # fmt: skip
        return dict(post(web_server, cast, rpc("SendMessage", params), V1).json())

    for refused in (
        send("m-ftp", taskPushNotificationConfig={"url": "ftp://hook.example/"}),
        send("m-long-url", taskPushNotificationConfig={"url": "https://hook.example/" + "x" * 2000}),
        send("m-long-id", taskPushNotificationConfig={"url": "https://hook.example/", "id": "i" * 101}),
        send("m" * 197),  # its key, a2a:<messageId>, would pass 200 characters
        # Webhooks no request could reach: no host, a space, a port that is not one.
        *(
            send(f"m-url-{i}", taskPushNotificationConfig={"url": url})
            for i, url in enumerate(
                ["http://", "https:///x", "http://a b.example/", "http://93.184.216.34:abc/", "http://h.example:99999/"]
            )
        ),
        send("m-deep", [{"data": nested(30)}]),  # deeper than a task can carry back (mapping.MAX_DATA_DEPTH)
    ):
        assert refused["error"]["code"] == -32602, refused
    assert not AgentRequest.objects.exists()

    # The same send with a webhook and no config id, three times (a client retrying): one task, one webhook.
    tasks = {send("m-push", taskPushNotificationConfig={"url": "https://hook.example/"})["result"]["task"]["id"]
             for _ in range(3)}  # fmt: skip
    assert len(tasks) == 1 and PushConfig.objects.filter(request_id=tasks.pop()).count() == 1
    # Its state pushed meanwhile, a fourth retry sets the same webhook: it is not pushed again.
    PushConfig.objects.update(pushed_state="TASK_STATE_WORKING")
    send("m-push", taskPushNotificationConfig={"url": "https://hook.example/"})
    assert PushConfig.objects.get().pushed_state == "TASK_STATE_WORKING"


def test_a_page_token_past_any_offset_is_refused(web_server: WebServer, cast: Cast) -> None:
    answer = post(web_server, cast, rpc("ListTasks", {"pageToken": "9" * 30}), V1).json()
    assert answer["error"]["code"] == -32602 and "pageToken" in answer["error"]["message"]


def test_a_body_past_the_limit_is_refused_before_it_is_read_whole(
    web_server: WebServer, cast: Cast, settings: LazySettings
) -> None:
    big = rpc("SendMessage", {"message": {**SEND["message"], "parts": [{"text": "x" * 400_000}]}})
    assert len(big) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # the server's, from the same settings
    response = post(web_server, cast, big, V1)
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"
    assert not AgentRequest.objects.exists()


def test_a_further_message_sets_its_webhook_keeps_its_id_and_a_refusal_lists_as_rejected(
    web_server: WebServer, cast: Cast
) -> None:
    def send(message: dict[str, Any], **configuration: Any) -> dict[str, Any]:
        params = {
            "message": {"role": "ROLE_USER", **message},
            "configuration": {"returnImmediately": True, **configuration},
        }
        return dict(post(web_server, cast, rpc("SendMessage", params), V1).json())

    def further(message_id: str, text: str, **configuration: Any) -> dict[str, Any]:
        return send({"messageId": message_id, "taskId": task, "parts": [{"text": text}]}, **configuration)

    task = send({"messageId": "t-1", "parts": [{"text": "Look into it."}]})["result"]["task"]["id"]
    hook = {"url": "https://hook.example/further"}
    assert "result" in further("f-1", "One more thing.", taskPushNotificationConfig=hook)
    assert PushConfig.objects.filter(request_id=task, url=hook["url"]).count() == 1
    assert "result" in further("f-1", "One more thing.")  # a resend: the agent has it already
    assert further("f-1", "Something else.")["error"]["code"] == -32602  # its id, with other parts
    assert SteeringItem.objects.filter(kind=SteeringItem.Kind.MESSAGE, payload__request_id=task).count() == 1
    # Its webhooks full (ten), a further message with one more is refused whole: no follow-up either.
    PushConfig.objects.bulk_create(
        PushConfig(request_id=task, config_id=f"c{i}", url=f"https://hook.example/{i}") for i in range(9)
    )
    assert further("f-2", "And this.", taskPushNotificationConfig={"url": "https://hook.example/x"})["error"]
    assert SteeringItem.objects.filter(kind=SteeringItem.Kind.MESSAGE, payload__request_id=task).count() == 1

    def listed(state: str) -> list[str]:
        page = post(web_server, cast, rpc("ListTasks", {"status": state}), V1).json()["result"]
        return [t["id"] for t in page.get("tasks", [])]

    AgentRequest.objects.filter(pk=task).update(status=AgentRequest.Status.FAILED, error={"code": "refused"})
    assert (listed("TASK_STATE_REJECTED"), listed("TASK_STATE_FAILED")) == ([task], [])


async def test_a_crash_in_the_gateway_is_answered_as_its_clients_read_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a text page: a call gets a JSON-RPC internal error, a card a problem; neither says why."""
    from gateways.a2a import asgi

    def crash(*args: Any) -> None:
        raise RuntimeError("secret detail that must not leak")

    monkeypatch.setattr(asgi, "authorize", crash)
    monkeypatch.setattr(asgi, "load_card", crash)
    transport = httpx.ASGITransport(app=asgi.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        called = await client.post(f"/a2a/{uuid.uuid4()}/ext/", content=rpc("GetTask", {"id": "t"}))
        card = await client.get(f"/a2a/{uuid.uuid4()}/ext/.well-known/agent-card.json")
    assert (called.status_code, called.json()["error"]["code"]) == (500, -32603)
    assert (card.status_code, card.headers["content-type"], card.json()["code"]) == (
        500, "application/problem+json", "server_error"
    )  # fmt: skip
    assert all(b"secret" not in r.content for r in (called, card))
