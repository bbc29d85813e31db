"""Connections to MCP servers, made and held by the worker process that runs a run's turns.

The SDK's client is asynchronous and a turn is not: each process keeps one event loop on a daemon
thread (made anew in a forked pool process), where every connection lives in a task of its own
that opens the client, lists the server's tools, and holds the connection until it is closed (the
SDK's transports must be entered and left in one task). Turns call into the loop and wait for the
answer. Connections are keyed by run and server, so the turns of a run that follow on this process
reuse them; they are closed when the run idles or ends, and any left unused for `IDLE_S` (a run
that went on elsewhere) are closed at the next use of the pool.
"""

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, Tool

from agents.mcp.models import McpServer
from config.per_process import PerProcess

logger = logging.getLogger(__name__)

IDLE_S = 300.0
T = TypeVar("T")


class ConnectFailed(Exception):
    """The server could not be reached, started or initialized; the message says why."""


def reason(exc: BaseException) -> str:
    """The innermost cause of a failure, in a line: task groups wrap it in exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500] if text != type(exc).__name__ else text


class Connection:
    """One open MCP client session to one server, living in the pool's event loop."""

    def __init__(self, config: McpServer) -> None:
        self.config = config
        self.client: Client | None = None
        self.tools: list[Tool] = []
        self.error = ""
        self.last_used = time.monotonic()
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    def target(self) -> Any:
        config = self.config
        if config.transport == McpServer.Transport.STDIO:
            params = StdioServerParameters(command=config.command, args=list(config.args), env=config.child_env())
            # The worker's sys.stderr may be a logging proxy without a file descriptor.
            return stdio_client(params, errlog=sys.__stderr__ or sys.stderr)
        http = httpx2.AsyncClient(
            headers=config.resolved_headers(),
            timeout=httpx2.Timeout(config.connect_timeout_s, read=config.call_timeout_s + config.connect_timeout_s),
        )
        return streamable_http_client(config.url, http_client=http)

    async def open(self) -> None:
        ready, self.stop = asyncio.Event(), asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self.hold(ready, self.stop))
        try:
            await asyncio.wait_for(ready.wait(), self.config.connect_timeout_s)
        except TimeoutError:
            self.task.cancel()
            raise ConnectFailed(f"no answer within {self.config.connect_timeout_s:g} s") from None
        if self.client is None:
            raise ConnectFailed(self.error or "closed while connecting")

    async def hold(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        try:
            async with Client(self.target(), read_timeout_seconds=self.config.connect_timeout_s) as client:
                tools: list[Tool] = []
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    if not (cursor := page.next_cursor):
                        break
                self.client, self.tools = client, tools
                ready.set()
                await stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001  (whatever a server does wrong is reported, not raised)
            self.error = reason(exc)
            logger.info("MCP server %s: %s", self.config.name, self.error)
        finally:
            self.client = None
            ready.set()

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> CallToolResult:
        client = self.client
        if client is None:
            raise ConnectFailed(self.error or "the connection was closed")
        self.last_used = time.monotonic()
        try:
            return await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        finally:
            self.last_used = time.monotonic()

    async def close(self) -> None:
        if self.stop is not None:
            self.stop.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(self.task, 5)
            except (TimeoutError, asyncio.CancelledError):
                pass
            except BaseException as exc:  # noqa: BLE001  (closing must not fail the turn)
                logger.info("closing MCP server %s: %s", self.config.name, reason(exc))

    @property
    def alive(self) -> bool:
        return self.client is not None and self.task is not None and not self.task.done()


class Pool:
    """This process's MCP connections, by (run id, server name)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="mcp-clients")
        self.thread.start()
        self.connections: dict[tuple[str, str], Connection] = {}
        self.lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def connect(self, run_id: str, config: McpServer) -> tuple[Connection, bool]:
        """The run's open connection to this server, made now if it has none (or lost it, or the
        server's row changed since); and whether it was made now."""
        self.sweep()
        key = (run_id, config.name)
        with self.lock:
            connection = self.connections.get(key)
        if connection is not None and connection.alive and connection.config.updated_at == config.updated_at:
            return connection, False
        if connection is not None:
            self.discard(key)
        connection = Connection(config)
        self.run(connection.open(), config.connect_timeout_s + 5)
        with self.lock:
            self.connections[key] = connection
        return connection, True

    def call(self, connection: Connection, tool: str, arguments: dict[str, Any], timeout: float) -> CallToolResult:
        # The SDK's own timeout answers first (and tells the server to cancel); ours only guards the thread.
        return self.run(connection.call(tool, arguments, timeout), timeout + 5)

    def discard(self, key: tuple[str, str]) -> None:
        with self.lock:
            connection = self.connections.pop(key, None)
        if connection is not None:
            try:
                self.run(connection.close(), 10)
            except TimeoutError:
                logger.warning("MCP server %s did not close in time", key[1])

    def close_run(self, run_id: str) -> None:
        with self.lock:
            keys = [key for key in self.connections if key[0] == run_id]
        for key in keys:
            self.discard(key)

    def has_run(self, run_id: str) -> bool:
        with self.lock:
            return any(key[0] == run_id for key in self.connections)

    def sweep(self) -> None:
        now = time.monotonic()
        with self.lock:
            stale = [key for key, c in self.connections.items() if now - c.last_used > IDLE_S]
        for key in stale:
            self.discard(key)


pool = PerProcess(Pool)


def open_for(run_id: str) -> bool:
    """Whether this process holds connections of the run (without starting a pool for nothing)."""
    made = pool.made()
    return made is not None and made.has_run(run_id)


__all__ = ["ConnectFailed", "Connection", "MCPError", "Pool", "open_for", "pool"]
