"""A local OpenAI-compatible chat-completions server, so tests exercise the real `openai` client
over HTTP. Each model name has a queue of scripted replies; faults (500, 429, a hang past the
client's timeout, malformed output) are queued the same way."""

import contextlib
import itertools
import json
import socket
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG_LIMIT_S = 60.0  # a hang ends when the test releases it, or at the latest after this


@dataclass(frozen=True)
class Fault:
    kind: str  # "500", "429", "hang", "malformed", "not-json"


SERVER_ERROR, RATE_LIMIT, HANG, MALFORMED = Fault("500"), Fault("429"), Fault("hang"), Fault("malformed")
NOT_JSON = Fault("not-json")  # a 200 whose body is not JSON at all
GATE = Fault("gate")  # hold this call until the test opens the gate, then answer with the next reply
_ids = itertools.count(1)


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    return {
        "id": call_id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


def say(content: str = "", *calls: dict[str, Any]) -> dict[str, Any]:
    """An assistant message, optionally with tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = list(calls)
    return message


Reply = dict[str, Any] | Fault
Rule = Callable[[dict[str, Any]], Reply]


def finish_once_answered(result: str, call_id: str, *, meanwhile: str) -> Rule:
    """A rule: say `meanwhile` until the newest message is a reply delivered to the agent (a
    `kind="response"` steering message), then call `finish` with `result`."""

    def decide(body: dict[str, Any]) -> Reply:
        if 'kind="response"' in body["messages"][-1].get("content", ""):
            return say("", tool_call("finish", {"result": result}, call_id))
        return say(meanwhile)

    return decide


class FakeLLM:
    def __init__(self) -> None:
        self.queues: dict[str, deque[Reply]] = defaultdict(deque)
        self.rules: dict[str, Rule] = {}
        self.received: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # ends every hang
        self.gate = threading.Event()
        self.connections: set[socket.socket] = set()  # kept alive between calls: closed by stop()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def script(self, model: str, *replies: Reply) -> None:
        """Replies for the next calls to model, in order."""
        with self.lock:
            self.queues[model].extend(replies)

    def rule(self, model: str, decide: Rule) -> None:
        """How to answer model once its scripted replies are used up: decide(request body)."""
        with self.lock:
            self.rules[model] = decide

    def calls_for(self, model: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.received if r["model"] == model]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def _next(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.received.append(body)
        return self._pop(body)

    def _pop(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            queue, rule = self.queues[body["model"]], self.rules.get(body["model"])
            if queue:
                return queue.popleft()
        return rule(body) if rule else say("Nothing more to do.")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a provider's API: the client reuses its connection
            # The body goes at once after the headers, as from a provider's server: with Nagle's algorithm
            # on, it waited for the client's delayed ACK of the headers, 40 ms added to some calls.
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections.add(self.connection)

            def finish(self) -> None:
                super().finish()
                with fake.lock:
                    fake.connections.discard(self.connection)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = fake._next(body)
                if reply == GATE:
                    fake.gate.wait(HANG_LIMIT_S)
                    reply = fake._pop(body)
                if reply == HANG:
                    fake.release.wait(HANG_LIMIT_S)
                    return self.send(500, {"error": {"message": "released"}})
                if reply == SERVER_ERROR:
                    return self.send(500, {"error": {"message": "upstream exploded", "type": "server_error"}})
                if reply == RATE_LIMIT:
                    return self.send(429, {"error": {"message": "slow down", "type": "rate_limit"}})
                if reply == MALFORMED:
                    return self.send(200, {"unexpected": "shape"})
                if reply == NOT_JSON:
                    return self.send(200, b"<html>upstream proxy error</html>")
                assert isinstance(reply, dict)
                usage = reply.get("usage", {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18})
                reply = {key: value for key, value in reply.items() if key != "usage"}  # a test's own usage
                self.send(
                    200,
                    {
                        "id": f"chatcmpl-{next(_ids)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": reply,
                                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                            }
                        ],
                        "usage": usage,
                    },
                )

            def send(self, status: int, payload: dict[str, Any] | bytes) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up first (a hang past its timeout)

        return Handler
