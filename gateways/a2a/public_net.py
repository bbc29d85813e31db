"""HTTP to addresses that others name (a remote agent's URL, the address its card gives for its
messages, a client's push-notification webhook), connected only to public addresses, checked on the
address each connection is made to.

The SDK's check of a URL (validate_push_notification_url, before each request) resolves its host
and judges what it finds; the connection then resolves the host again. A name whose DNS answers a
public address to the check and a private one to the connection (DNS rebinding) would reach a
private service with our message and the remote's bearer token. Here the connection goes to the
address that was judged: the host is resolved once, every address it gave must be public, and the
socket is opened to the first of them (TLS still checks the certificate against the host's name).
"""

import ipaddress
import socket
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import httpcore
import httpx

Transport = TypeVar("Transport", httpx.HTTPTransport, httpx.AsyncHTTPTransport)


class NotPublic(Exception):
    """A connection refused before it was made: its host is not at a public address."""


def is_public(address: str) -> bool:
    """A global unicast address (an IPv4-mapped IPv6 one judged as the IPv4 inside it): not
    loopback, private, link-local, shared (100.64.0.0/10), reserved, unspecified or multicast."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def judged(host: str, found: list[Any]) -> str:
    """The address to connect to, of those `getaddrinfo` found for host: all must be public."""
    addresses = [info[4][0] for info in found]
    if not addresses or not all(is_public(address) for address in addresses):
        raise NotPublic(f"{host} is not at a public address.")
    return str(addresses[0])


@contextmanager
def unresolved(host: str) -> Iterator[None]:
    """A name that does not resolve fails the connection as httpx's own would (httpx.ConnectError)."""
    try:
        yield
    except OSError as exc:
        raise httpcore.ConnectError(f"{host}: {exc}") from exc


class PublicOnly(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self.inner = inner

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:  # fmt: skip
        with unresolved(host):
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return self.inner.connect_tcp(judged(host, found), port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise NotPublic(f"{path} is a local socket.")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class AsyncPublicOnly(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self.inner = inner

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:  # fmt: skip
        with unresolved(host):
            found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return await self.inner.connect_tcp(judged(host, found), port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise NotPublic(f"{path} is a local socket.")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


# httpx takes no network backend of its own: its transport's connection pool (httpcore) is given
# ours around the one it made (httpx and httpcore are pinned in requirements/base.txt; the tests in
# tests/gateways/test_public_net.py fail if either moves these). Behind an HTTP proxy named in the
# environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) the connections go to the proxy, which resolves
# the hosts itself: httpx's own transport then, which goes through it (None: the client's default).


def public_transport() -> httpx.HTTPTransport | None:
    return None if behind_proxy() else around(httpx.HTTPTransport(), PublicOnly)


def async_public_transport() -> httpx.AsyncHTTPTransport | None:
    return None if behind_proxy() else around(httpx.AsyncHTTPTransport(), AsyncPublicOnly)


def around(transport: Transport, backend: Callable[[Any], Any]) -> Transport:
    transport._pool._network_backend = backend(transport._pool._network_backend)
    return transport


def behind_proxy() -> bool:
    return bool({"http", "https", "all"} & set(urllib.request.getproxies()))
