"""A fork server for the suite's Python children (Celery workers, web servers, beat).

Each of those children used to import the same libraries again: more than a second of CPU of the
two seconds it takes to start, for each of the 150 or so processes a run of the suite starts. The
server is a Python process that has imported them once, before anything reads the settings or the
environment; each child is a fork of it that then runs `python -m <module> <args>` with its own
environment, working directory and log, in a session of its own, exactly as a new interpreter
would from there on (Django, the app and the settings are imported by the child).

What is imported ahead is only what opens no file, socket or thread and reads nothing a test
sets for its children when imported: not daphne's server module, which installs Twisted's reactor
and its event loop (a child would share the server's epoll instance), nor prometheus-client, which
decides at import whether to count for several processes (by `PROMETHEUS_MULTIPROC_DIR`, set per
worker). The server checks that none of those was imported, and that the settings were not read
and no thread started; otherwise, or when the server is not there, `spawn()` starts the child
with Popen.

The server is the children's parent: it reaps a child only when asked (`poll`), so that a dead
child keeps its pid, the group id `kill_group()` signals, until the test has seen it exit.
Each test process (pytest-xdist's too) has its own server, started at its first spawn; the server
ends when that process closes the connection, or exits.
"""

import contextlib
import json
import os
import runpy
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

BASE_DIR = Path(__file__).resolve().parent.parent
LOGS = BASE_DIR / "test-artifacts"  # the server's own output, beside the tests' logs

# Imported once by the server. Each one is importable without settings and does nothing but define.
AHEAD = (
    "openai", "httpx", "celery", "celery.app", "celery.worker", "celery.bin.celery", "celery.apps.worker",
    "kombu", "kombu.transport.redis", "redis", "psycopg", "regex",
    "django.db.models", "django.http", "django.urls", "django.contrib.postgres.fields",
    "rest_framework.serializers", "rest_framework.response", "drf_spectacular.utils",
    "channels.layers", "channels_redis.core", "twisted.web.http", "twisted.internet.asyncioreactor",
    "autobahn.twisted.websocket", "mcp.types", "mcp.client.stdio", "mcp.client.streamable_http",
    "mcp.server.mcpserver", "mcp.server.streamable_http_manager", "a2a.types", "a2a.client", "a2a.utils.errors",
    "a2a.server.routes.jsonrpc_dispatcher", "a2a.server.events", "google.protobuf.json_format", "uvicorn",
)  # fmt: skip
NOT_AHEAD = ("daphne.server", "twisted.internet.reactor", "prometheus_client")  # see above


class Process(Protocol):
    """What the tests use of a child: a Popen, or a ForkedProcess."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def spawn(module: str, args: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> Process:
    """`python -m module args` in a session of its own, its output appended to log."""
    server = _server()
    if server is not None:
        with contextlib.suppress(OSError, ValueError):
            pid = server.call("spawn", module=module, args=args, cwd=str(cwd), env=env, log=str(log))["pid"]
            if pid:
                return ForkedProcess(server, pid)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


class ForkedProcess:
    """A child of the fork server, with the part of Popen's interface the tests use (they signal
    its process group: kill_group())."""

    def __init__(self, server: "Client", pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.call("poll", pid=self.pid)["returncode"]
        return self.returncode

    def exited(self) -> bool:
        """Whether it has exited, without reaping it (its pid stays its own until poll())."""
        return bool(self.server.call("exited", pid=self.pid)["exited"])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.02)
        return code


class Client:
    """This test process's connection to its server: one JSON line out, one back."""

    def __init__(self) -> None:
        path = os.path.join(tempfile.mkdtemp(prefix="agora-forkserver-"), "socket")  # the server removes both
        LOGS.mkdir(exist_ok=True)
        log = (LOGS / f"forkserver-{os.getpid()}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "tests.forkserver", path], cwd=BASE_DIR, stdin=subprocess.DEVNULL,
            stdout=log, stderr=log, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},  # none read ahead
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()  # nothing, if it has exited
                self.proc.wait()
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                raise OSError("the fork server did not start")
            time.sleep(0.02)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.file = self.sock.makefile("rw")
        self.lock = threading.Lock()

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            self.file.write(json.dumps({"op": op, **fields}) + "\n")
            self.file.flush()
            line = self.file.readline()
        if not line:
            raise OSError("the fork server is gone")
        answer: dict[str, Any] = json.loads(line)
        return answer


_client: dict[int, Client | None] = {}


def _server() -> Client | None:
    """This process's server (a forked test process starts its own), None when it cannot start."""
    pid = os.getpid()
    if pid not in _client:
        try:
            _client[pid] = Client()
        except OSError:
            _client[pid] = None
    return _client[pid]


# --- the server ----------------------------------------------------------------------------------


def serve(path: str) -> dict[str, Any] | None:
    """Serve the test process until it goes; in a child, return its spawn request (see run())."""
    for name in AHEAD:
        __import__(name)
    from django.conf import settings

    imported = [name for name in NOT_AHEAD if name in sys.modules]
    if imported or settings.configured or threading.active_count() > 1:  # no child would be what it would have been
        sys.exit(
            f"imported ahead: {imported}, settings read: {settings.configured}, threads: {threading.active_count()}"
        )
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".tmp")
    listener.listen(1)
    os.rename(path + ".tmp", path)  # the client connects once the name exists
    conn, _ = listener.accept()
    listener.close()
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    stream = conn.makefile("rw")
    for line in stream:  # until the test process closes its end or exits
        request = json.loads(line)
        answer: dict[str, Any]
        try:
            if request["op"] == "spawn":
                request["log_fd"] = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                if (pid := os.fork()) == 0:
                    stream.close()
                    conn.close()
                    return request
                os.close(request["log_fd"])
                answer = {"pid": pid}
            else:
                answer = peek(request["op"], request["pid"])
        except OSError as exc:  # a spawn that failed: the client uses Popen
            print(f"spawn of {request.get('module')} failed: {exc}", file=sys.stderr)
            answer = {"pid": None}
        stream.write(json.dumps(answer) + "\n")
        stream.flush()
    return None


def peek(op: str, pid: int) -> dict[str, Any]:
    if op == "poll":  # reaps it, as Popen.poll() does
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return {"returncode": -1}
        return {"returncode": os.waitstatus_to_exitcode(status) if done else None}
    if op == "exited":
        try:
            return {"exited": os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None}
        except ChildProcessError:
            return {"exited": True}
    raise ValueError(f"unknown op {op}")


def run(request: dict[str, Any]) -> None:
    """The child, at the top level of the server's interpreter: from here on it is what
    `python -m module args` would be, down to its exit (its threads joined, its atexit handlers
    run, its exit code that of its SystemExit or 1 after a traceback)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(request["log_fd"], 1)
    os.dup2(request["log_fd"], 2)
    os.close(null)
    os.close(request["log_fd"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if (child := serve(sys.argv[1])) is not None:
        run(child)
