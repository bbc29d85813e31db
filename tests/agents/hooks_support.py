"""Helpers for the hook tests: handler entries and a small HTTP server standing in for a webhook."""

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCRIPT = str(Path(__file__).with_name("hook_command.py"))


def command(name: str, event: str, *options: str, timeout_s: float = 20, **extra: Any) -> dict[str, Any]:
    """A trusted command handler running tests/agents/hook_command.py with options."""
    return {"name": name, "event": event, "type": "command", "argv": [sys.executable, SCRIPT, *options],
            "timeout_s": timeout_s, "trusted": True, **extra}  # fmt: skip


def python(name: str, event: str, function: str, *, timeout_s: float = 20, **extra: Any) -> dict[str, Any]:
    return {"name": name, "event": event, "type": "python", "callable": f"tests.agents.hook_handlers.{function}",
            "timeout_s": timeout_s, "trusted": True, **extra}  # fmt: skip


def webhook(name: str, event: str, url: str, *, timeout_s: float = 20, **extra: Any) -> dict[str, Any]:
    return {"name": name, "event": event, "type": "webhook", "url": url, "timeout_s": timeout_s, "trusted": True,
            **extra}  # fmt: skip


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie nobody reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


class Hookbin:
    """A webhook receiver: records each POSTed event and answers `reply` (status, body) after `delay`."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.reply: tuple[int, str] = (200, "")
        self.delay = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(json.loads(body))
                time.sleep(outer.delay)
                status, text = outer.reply
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(text.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def hookbin() -> Iterator[Hookbin]:
    server = Hookbin()
    try:
        yield server
    finally:
        server.stop()
