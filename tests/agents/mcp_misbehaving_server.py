"""A stdio MCP server for the tests that misbehaves on purpose, written by hand (newline-delimited
JSON-RPC) so that it can send what the SDK's own server never would.

Its tools: `badresult` answers a result that is not a CallToolResult, `die` exits without answering,
`ok` answers `{"ok": true, "got": <its arguments>}`; with MISBEHAVING_NUL_NAME set it also offers a
tool whose name holds a NUL, and with MISBEHAVING_INIT_ERROR set it refuses `initialize` with a
NUL in its message."""

import json
import os
import sys


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(id: object, result: dict[str, object]) -> None:
    send({"jsonrpc": "2.0", "id": id, "result": result})


def main() -> None:
    names = ["badresult", "die", "ok"] + (["x\x00y"] if os.environ.get("MISBEHAVING_NUL_NAME") else [])
    for line in sys.stdin:
        message = json.loads(line) if line.strip() else {}
        method, id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if id is None:
            continue  # a notification
        if method == "initialize" and os.environ.get("MISBEHAVING_INIT_ERROR"):
            send({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "refused\x00here"}})
        elif method == "initialize":
            answer(id, {"protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                        "serverInfo": {"name": "misbehaving", "version": "1"}})  # fmt: skip
        elif method == "tools/list":
            answer(id, {"tools": [{"name": n, "inputSchema": {"type": "object", "properties": {}}} for n in names]})
        elif method == "tools/call" and params.get("name") == "badresult":
            answer(id, {"content": "not a list", "isError": "maybe"})
        elif method == "tools/call" and params.get("name") == "die":
            sys.exit(3)
        elif method == "tools/call":
            answer(id, {"content": [], "structuredContent": {"ok": True, "got": params.get("arguments")}})
        else:
            send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
