"""What Django checks at the edge of a request, for the ASGI apps beside it (the A2A and MCP
gateways): the Host against ALLOWED_HOSTS, and the limit on a request body
(DATA_UPLOAD_MAX_MEMORY_SIZE), which they read whole: past it, 413 `payload_too_large` before the app
sees a byte, as the REST API answers (config/parsers.py)."""

import json
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from config.problems import problem_body

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


def headers_of(scope: Any) -> dict[str, str]:
    """The request's headers by lower-case name; a name sent twice has its values joined with a
    comma, as Django reads them (two Host headers are then no allowed host, as Django decides)."""
    headers: dict[str, str] = {}
    for key, value in scope.get("headers", []):
        name = key.decode("latin-1").lower()
        headers[name] = f"{headers[name]},{value.decode('latin-1')}" if name in headers else value.decode("latin-1")
    return headers


def host_allowed(headers: dict[str, str]) -> bool:
    """Whether the request's Host is one of ALLOWED_HOSTS, as Django decides it."""
    domain, _ = split_domain_port(headers.get("host", ""))
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)


async def within_limit(app: Any, scope: Any, receive: Receive, send: Send) -> None:
    """Run `app` with the request's body read first, counted as it arrives; past the limit it gets
    no call. Whatever comes after the body (a disconnect) still reaches the app."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client left before its body was whole
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            await too_large(send, limit)
            return
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    body: dict[str, Any] | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def replay() -> dict[str, Any]:
        nonlocal body
        if body is not None:
            message, body = body, None
            return message
        return await receive()

    await app(scope, replay, send)


async def too_large(send: Send, limit: int) -> None:
    detail = f"Limit is {limit} bytes for a request body."
    data = json.dumps(problem_body(413, "payload_too_large", "Payload too large", detail)).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": data})
