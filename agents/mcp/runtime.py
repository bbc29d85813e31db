"""MCP tools in a run's turns: which are offered to the model, and how a call is made.

A profile lists the servers whose tools its agents get (`AgentProfile.mcp_servers`); each allowed
tool is offered as `<server>__<tool>` with the server's input schema. OpenAI function names allow
only letters, digits, `_` and `-` (no dots), so the separator is `__`, a server's name has no
underscore, and any other character of a tool's name becomes `_`; the offered name maps back to the
server and the tool's real name. A call is made outside any transaction, by the worker running the
turn, and its outcome (success, tool error, timeout, unavailable server) is the tool's result for
the model; the executor stores it in the transcript and journals it as `mcp_call`.
"""

import json
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError
from mcp import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, TextContent
from pydantic import ValidationError

from agents.mcp.connections import ConnectFailed, Connection, open_for, pool
from agents.mcp.models import McpServer
from config.payloads import MalformedJson, Unstorable, loads, storable_text

logger = logging.getLogger(__name__)

SEPARATOR = "__"
NAME_MAX = 64  # OpenAI's limit for a function name


def offered_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{re.sub(r'[^A-Za-z0-9_-]', '_', tool)}"[:NAME_MAX]


def is_mcp_call(name: str) -> bool:
    """Built-in tools have no `__` in their names; every MCP tool has."""
    return SEPARATOR in name


@dataclass(frozen=True)
class Offered:
    server: str
    tool: str
    schema: dict[str, Any]  # the function definition the model sees


def function(name: str, server: str, tool: Any) -> dict[str, Any]:
    parameters = dict(tool.input_schema or {})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    description = f"[{server}] {tool.description or tool.title or tool.name}"
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def connect_servers(run_id: str, names: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Offered], bool]:
    """Connect a run to each named server (reusing this process's open connections).

    Returns the report `{server: {"status": "connected", "tools": [offered names]}` or
    `{"status": "failed", "reason": …, "tools": []}}`, the offered tools by name, and whether any
    connection was made or failed now (so a caller journals only what changed).
    """
    configs = {s.name: s for s in McpServer.objects.filter(name__in=names)}
    report: dict[str, dict[str, Any]] = {}
    offered: dict[str, Offered] = {}
    changed = False
    for name in names:
        config = configs.get(name)
        if config is None or not config.enabled:
            report[name] = {"status": "failed", "reason": "no such enabled MCP server", "tools": []}
            changed = True
            continue
        try:
            connection, fresh = pool().connect(run_id, config)
        except (ConnectFailed, FutureTimeout) as exc:
            # The server's own words, maybe: kept as no column refuses them (a NUL, say).
            report[name] = {"status": "failed", "reason": storable_text(str(exc)) or "no answer in time", "tools": []}
            changed = True
            continue
        changed = changed or fresh
        for tool in connection.tools:
            if not config.allows(tool.name):
                continue
            offered_as = offered_name(name, tool.name)
            offered[offered_as] = Offered(server=name, tool=tool.name, schema=function(offered_as, name, tool))
        report[name] = {"status": "connected", "tools": [o for o, t in offered.items() if t.server == name]}
    return report, offered, changed


def connection_report(run_id: str, servers: list[str]) -> dict[str, dict[str, Any]]:
    """`{server: {"status": "connected", "tools": [...]} | {"status": "failed", "reason": ...}}` for a
    run's servers, connecting them on this process: what a run's result reports as its `mcp`."""
    return connect_servers(run_id, servers)[0]


def check_servers(key: str, servers: list[str]) -> dict[str, dict[str, Any]]:
    """Connect to each server under `key`, report, and close again: a check made before a run whose
    turns will connect on whichever worker runs them (no pool is started for no server)."""
    if not servers:
        return {}
    try:
        return connection_report(key, servers)
    finally:
        if open_for(key):
            pool().close_run(key)


def failure(code: str, message: Any) -> dict[str, Any]:
    """A call's failure, as the model reads it: a tool error."""
    return {"error": {"code": code, "message": message}}


def content_of(result: CallToolResult) -> Any:
    """What the model sees of a result: its structured content, else its text, else its blocks."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if len(texts) == len(result.content):
        return "\n".join(texts)
    return [block.model_dump(mode="json", exclude_none=True) for block in result.content]


@dataclass
class CallOutcome:
    result: dict[str, Any]  # the tool's result for the model
    event: dict[str, Any]  # the `mcp_call` journal event's data
    connected: dict[str, dict[str, Any]] | None = None  # the connection report, for the journal (connect())


# The last connection report journaled per run by this process: a server that stays down is
# tried again at every task of the run, and journaled once.
_reported: dict[str, dict[str, dict[str, Any]]] = {}
REPORTS_KEPT = 256


class RunTools:
    """The MCP tools of one run, as one task of its turns sees them; connections are the process's."""

    def __init__(self, run_id: str, servers: list[str]) -> None:
        self.run_id = run_id
        self.servers = list(servers)
        self.offered: dict[str, Offered] | None = None

    def connect(self) -> dict[str, dict[str, Any]] | None:
        """Connect (once per task); the report when something changed, for the journal."""
        if self.offered is not None or not self.servers:
            self.offered = self.offered or {}
            return None
        report, self.offered, changed = connect_servers(self.run_id, self.servers)
        if not changed or _reported.get(self.run_id) == report:
            return None
        _reported[self.run_id] = report
        while len(_reported) > REPORTS_KEPT:
            _reported.pop(next(iter(_reported)))
        return report

    def release(self, *, still_active: Callable[[], bool]) -> None:
        """After a task of the run: keep its connections for its next turns, or close them when the
        run idles, waits or ends. Costs nothing for a run without MCP servers."""
        if not (self.servers and open_for(self.run_id)):
            return
        try:
            active = still_active()
        except DatabaseError:  # the task is failing anyway: do not hide why behind this
            active = False
        if not active:
            pool().close_run(self.run_id)

    def schemas(self) -> list[dict[str, Any]]:
        return [offered.schema for offered in (self.offered or {}).values()]

    def call(self, name: str, arguments: str) -> CallOutcome:
        """Make one call, outside any transaction; every failure is a tool error for the model. The
        model's arguments are read as a built-in tool's are (tools.execute): JSON no decoder reads
        or no column stores is refused before the server sees it."""
        connected = self.connect()  # a task that starts with a call (after a wait, a crash) connects here
        offered = (self.offered or {}).get(name)
        if offered is None:
            error = failure("unknown_tool", f"No tool {name!r} is available to you.")
            return CallOutcome(error, {"tool": storable_text(name), "outcome": "unknown_tool"}, connected)
        event: dict[str, Any] = {"server": offered.server, "tool": storable_text(offered.tool)}
        try:
            args = loads(arguments or "{}", where="arguments")
        except MalformedJson as exc:
            return CallOutcome(failure("invalid_arguments", str(exc)), event | {"outcome": "invalid"}, connected)
        except Unstorable as exc:
            return CallOutcome(failure("invalid_payload", str(exc)), event | {"outcome": "invalid"}, connected)
        if not isinstance(args, dict):
            message = "Arguments must be a JSON object."
            return CallOutcome(failure("invalid_arguments", message), event | {"outcome": "invalid"}, connected)
        started = time.perf_counter()
        result, outcome = self.attempt(offered, args)
        event |= {
            "outcome": outcome,
            "duration_ms": round((time.perf_counter() - started) * 1000, 1),
            "result_bytes": len(json.dumps(result, ensure_ascii=False, default=str).encode()),
        }
        return CallOutcome(result, event, connected)

    def attempt(self, offered: Offered, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
        config = McpServer.objects.filter(name=offered.server).first()
        if config is None or not config.enabled or not config.allows(offered.tool):
            return failure("unknown_tool", f"{offered.tool} is no longer allowed."), "refused"
        try:
            connection: Connection = pool().connect(self.run_id, config)[0]
            result = pool().call(connection, offered.tool, args, config.call_timeout_s)
        except (ConnectFailed, FutureTimeout) as exc:
            message = f"MCP server {offered.server} is unavailable: {exc or 'no answer in time'}"
            return failure("unavailable", message), "unavailable"
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                message = f"{offered.tool} did not answer within {config.call_timeout_s:g} s."
                return failure("timeout", message), "timeout"
            if exc.code == CONNECTION_CLOSED:  # the server went away during the call
                message = f"MCP server {offered.server} is unavailable: {exc.message}"
                return failure("unavailable", message), "unavailable"
            return failure("mcp_error", exc.message), "error"
        except ValidationError as exc:  # the SDK read the answer: it is not a tool result
            logger.warning("MCP server %s: %s answered no tool result: %r", offered.server, offered.tool, exc)
            message = f"{offered.tool} answered what is not a tool result ({type(exc).__name__})."
            return failure("tool_error", message), "tool_error"
        if result.is_error:
            return failure("tool_error", content_of(result)), "tool_error"
        content = content_of(result)
        return (content if isinstance(content, dict) else {"result": content}), "ok"
