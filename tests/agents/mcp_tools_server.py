"""A small MCP server for the tests, on the same SDK: `python mcp_tools_server.py` serves stdio,
`--http PORT` streamable HTTP. With MCP_TEST_LOG set, `mark` and `block` append a line per call
there, so a test can count executions across worker crashes; `block` waits until the file named
by MCP_TEST_GATE exists."""

import argparse
import asyncio
import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server: MCPServer = MCPServer("test-tools")


def log(line: str) -> None:
    with Path(os.environ["MCP_TEST_LOG"]).open("a") as file:
        file.write(line + "\n")


@server.tool()
def echo(text: str) -> str:
    """Say it back."""
    return text


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ToolError("broken on purpose")


@server.tool()
async def hang(seconds: float = 60) -> str:
    """Answers after a long time."""
    await asyncio.sleep(seconds)
    return "late"


@server.tool()
def pid() -> int:
    """This server process's id."""
    return os.getpid()


@server.tool()
def secret() -> str:
    """A tool no agent may call."""
    return "leaked"


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header of this call (HTTP only)."""
    return (ctx.headers or {}).get("authorization", "")


@server.tool()
def mark(label: str) -> str:
    """Record one execution."""
    log(f"mark {label}")
    return f"marked {label}"


@server.tool()
async def block(label: str) -> str:
    """Record that it started, then wait for the gate file."""
    log(f"block {label}")
    gate = Path(os.environ["MCP_TEST_GATE"])
    while not gate.exists():
        await asyncio.sleep(0.05)
    return f"unblocked {label}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    port = parser.parse_args().http
    if port:
        server.run("streamable-http", host="127.0.0.1", port=port, stateless_http=True, json_response=True)
    else:
        server.run()
