"""The streamable HTTP endpoint of Agora's MCP server, mounted at `/mcp` in the ASGI app.

Stateless on purpose: every POST carries its own bearer token and needs no session kept in this
process, so any web process can answer any call, as for the REST API (the web tier keeps no state).
Answers are plain JSON (no SSE stream), which every streamable HTTP client accepts. The SDK's
session manager needs a running task group; daphne sends no ASGI lifespan events, so the endpoint
starts it with its first request and keeps it for the life of the process.
"""

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async
from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from config.edge import headers_of, host_allowed, within_limit
from config.problems import SERVER_ERROR_DETAIL
from gateways.mcp import operations
from gateways.mcp.server import build_server
from sagas import errors
from sagas.waits import release_connections

logger = logging.getLogger(__name__)
MCP_PATH = "/mcp"
KEYWORDS = ("bearer", "token")  # as the REST API accepts them

Scope = dict[str, Any]


def bearer_key(headers: Mapping[str, str] | None) -> str:
    value = next((v for k, v in (headers or {}).items() if k.lower() == "authorization"), "")
    parts = value.split()
    return parts[1] if len(parts) == 2 and parts[0].lower() in KEYWORDS else ""


def request_key(ctx: Context) -> str:
    """The caller of one tool call over HTTP: the token on that very request."""
    return bearer_key(ctx.headers)


def authenticated(key: str) -> bool:
    try:
        operations.principal(key)
        return True
    except errors.KernelError:
        return False
    finally:
        release_connections()


async def respond(send: Any, status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})


class McpEndpoint:
    """ASGI app: check the Host like Django does, refuse a request without a valid API token (401),
    then hand it to the SDK's streamable HTTP transport."""

    def __init__(self) -> None:
        self.server = build_server(request_key)
        # Host and Origin are checked here against ALLOWED_HOSTS; the SDK's own DNS-rebinding list
        # would be a second list to keep in step (and a page cannot forge the bearer token anyway).
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.manager: StreamableHTTPSessionManager = self.server.session_manager
        self.ready: asyncio.Event | None = None
        self.runner: asyncio.Task[None] | None = None

    async def running(self) -> None:
        if self.ready is None:
            self.ready = asyncio.Event()
            self.runner = asyncio.get_running_loop().create_task(self.run_manager(self.ready))
        await self.ready.wait()

    async def run_manager(self, ready: asyncio.Event) -> None:
        async with self.manager.run():
            ready.set()
            await asyncio.Event().wait()  # for the life of the process

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """answer(), and for a crash before any answer began one that says so (logged, no details)
        rather than the server's text page."""
        started = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.answer(scope, receive, sending)
        except Exception:
            if started:
                raise
            logger.exception("MCP endpoint: a crash before any answer")
            await respond(send, 500, {"error": "server_error", "error_description": SERVER_ERROR_DETAIL})

    async def answer(self, scope: Scope, receive: Any, send: Any) -> None:
        headers = headers_of(scope)
        if not host_allowed(headers):
            await respond(send, 400, {"error": "invalid_host", "error_description": "Host not allowed."})
            return
        if not await sync_to_async(authenticated)(bearer_key(headers)):
            await respond(
                send,
                401,
                {"error": "invalid_token", "error_description": "An agent's API token is required (Bearer)."},
                ((b"www-authenticate", b'Bearer error="invalid_token"'),),
            )
            return
        if scope.get("method") == "GET":  # a stream for messages from the server: this one sends none
            await respond(send, 405, {"error": "method_not_allowed", "error_description": "POST your calls."},
                          ((b"allow", b"POST"),))  # fmt: skip
            return
        await self.running()
        await within_limit(self.manager.handle_request, scope, receive, send)


def mounted(app: Any) -> Any:
    """`app` (the Django ASGI app) with the MCP endpoint at `/mcp`."""
    endpoint = McpEndpoint()

    async def route(scope: Scope, receive: Any, send: Any) -> None:
        if scope["path"].rstrip("/") == MCP_PATH:
            await endpoint(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route
