"""Outbound HTTP to addresses others name connects only to a public address, the one its host was
judged at: a check of the URL that passed (as it would on a rebinding DNS's first, public answer)
does not let the connection reach a private address (its next answer)."""

import asyncio
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import httpx
import pytest
from a2a.types import a2a_pb2 as pb
from django.conf import LazySettings

from gateways.a2a import outbound, public_net, tasks
from gateways.a2a.models import PushConfig
from sagas.remotes import RemoteCall
from tests.gateways.test_a2a_outbound_screen import Recorder


@pytest.fixture
def private() -> Iterator[tuple[str, type[Recorder]]]:
    """A server on loopback, a private address, recording what reaches it."""

    class Private(Recorder):
        seen: list[tuple[str, str, str | None]] = []

        def do_POST(self) -> None:  # a webhook's: whatever the body, taken
            self.rfile.read(int(self.headers["Content-Length"]))
            self.seen.append(("POST", self.path, self.headers.get("Authorization")))
            self.answer(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Private)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/agent/", Private
    finally:
        server.shutdown()
        server.server_close()


async def passes(url: str) -> bool:
    return True  # the check before the request, answered on a public address


@pytest.fixture
def webhooks_screened(settings: LazySettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Webhooks refused on private addresses, their URL's check before the request passed."""
    settings.AGORA_A2A_PUSH_PRIVATE_URLS = False
    monkeypatch.setattr(tasks, "validate_push_notification_url", passes)


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True), ("2001:4860:4860::8888", True), ("127.0.0.1", False), ("::1", False),
        ("10.1.2.3", False), ("192.168.1.1", False), ("172.16.0.1", False), ("169.254.169.254", False),
        ("100.64.0.1", False), ("0.0.0.0", False), ("fe80::1%eth0", False), ("::ffff:127.0.0.1", False),
        ("::ffff:8.8.8.8", True), ("224.0.0.1", False), ("fd00::1", False), ("not an address", False),
    ],
)  # fmt: skip
def test_only_global_unicast_addresses_are_public(address: str, public: bool) -> None:
    assert public_net.is_public(address) is public


def test_a_connection_to_a_private_address_is_refused_before_it_is_made(
    private: tuple[str, type[Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, server = private

    with httpx.Client(transport=public_net.public_transport()) as http, pytest.raises(public_net.NotPublic):
        http.get(url)
    with pytest.raises(public_net.NotPublic):
        asyncio.run(get_async(url))
    assert server.seen == []

    # The same transports reach it where its address is the one allowed: they connect for real.
    monkeypatch.setattr(public_net, "is_public", lambda address: address == "127.0.0.1")
    with httpx.Client(transport=public_net.public_transport()) as http:
        assert http.get(url.replace("127.0.0.1", "localhost")).status_code == 200
    assert asyncio.run(get_async(url)) == 200
    assert [path for _, path, _ in server.seen] == ["/agent/", "/agent/"]


def test_a_name_that_does_not_resolve_fails_as_any_connection_does() -> None:
    with httpx.Client(transport=public_net.public_transport()) as http, pytest.raises(httpx.ConnectError):
        http.get("http://nowhere.invalid/")
    with pytest.raises(httpx.ConnectError):
        asyncio.run(get_async("http://nowhere.invalid/"))


async def get_async(url: str) -> int:
    async with httpx.AsyncClient(transport=public_net.async_public_transport()) as http:
        return (await http.get(url)).status_code


def test_a_remote_agent_whose_name_passed_the_check_reaches_no_private_address(
    private: tuple[str, type[Recorder]], settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, server = private
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = False
    monkeypatch.setattr(outbound, "validate_push_notification_url", passes)
    monkeypatch.setenv("AGORA_TEST_REBIND_TOKEN", "the-remote's-secret")
    call = RemoteCall(id="call-1", url=url, agent_name="rebinding", message="hi", task_id="")

    with pytest.raises(outbound.Refused) as refused:
        asyncio.run(outbound.exchange(call, "AGORA_TEST_REBIND_TOKEN"))

    assert refused.value.code == "remote_not_allowed" and "not at a public address" in str(refused.value)
    assert server.seen == []  # neither the card's fetch nor the bearer token reached it


def test_a_webhook_whose_name_passed_the_check_reaches_no_private_address(
    private: tuple[str, type[Recorder]], webhooks_screened: None, settings: LazySettings
) -> None:
    url, server = private
    config = PushConfig(url=url, token="the-client's-token")

    error = tasks.deliver(config, pb.Task(id="t-1", context_id="c"))

    assert error == "127.0.0.1 is not at a public address." and server.seen == []
    settings.AGORA_A2A_PUSH_PRIVATE_URLS = True  # a deployment whose webhooks live on its own network
    assert tasks.deliver(config, pb.Task(id="t-1", context_id="c")) is None
    assert [method for method, _, _ in server.seen] == ["POST"]


def test_behind_a_proxy_named_in_the_environment_the_connection_goes_to_the_proxy(
    private: tuple[str, type[Recorder]], webhooks_screened: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy resolves the hosts itself: the webhook is posted through it, as before."""
    proxy, server = private
    monkeypatch.setenv("HTTP_PROXY", proxy.removesuffix("/agent/"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    assert tasks.deliver(PushConfig(url="http://hooks.example/task"), pb.Task(id="t-1", context_id="c")) is None
    assert server.seen == [("POST", "http://hooks.example/task", None)]
