"""Worker hosts for the scale-out test: each Celery worker on a host of its own, started from the
production worker command (config/production.py).

Where the test runs as root and `ip netns`, `unshare` and `socat` are there, a host is a network
namespace joined to the root namespace by a veth pair, with its own hostname (a UTS namespace, so
the worker's node name `w1@%h` differs by host exactly as in production) and its own data dir. Its
worker reaches PostgreSQL, Redis and the model server only over that link: the servers listen on
loopback, so a socat forwarder per server, bound to the root side of the link, carries the traffic.
Elsewhere a host is a separate process with its own node name (`w1@<host>`) and data dir, reaching
the servers directly (`TEST_WORKER_HOSTS=processes` asks for this where namespaces would work).
`mode` says which of the two ran.

Everything is removed in `close()`, even when the test fails: processes first (a namespace lives
on while a process is in it), then the namespaces (which take their veth pairs with them).
"""

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from config import production
from tests.support import BASE_DIR, child_env, kill_group, shared_database_url, stop_process, wait_until

NETNS = "network namespaces"
PROCESSES = "separate processes"


def netns_unavailable() -> str:
    """Why this machine cannot give each worker a network namespace; empty when it can."""
    if os.environ.get("TEST_WORKER_HOSTS") == "processes":
        return "TEST_WORKER_HOSTS=processes"
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("ip", "unshare", "socat") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    probe = f"agora-probe-{uuid.uuid4().hex[:6]}"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode != 0:
        return f"`ip netns add` failed: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def free_subnet() -> str:
    """The first three octets of a 10.x.y.0/24 no interface of this machine uses."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    while True:
        prefix = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
        if f" {prefix}." not in used:
            return prefix


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def with_host(url: str, host: str) -> str:
    """url with its host replaced (user, port, path and query kept)."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth + '@' if auth else ''}{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass
class WorkerHost:
    """One host: its name, its worker's node name, and (in a namespace) its link's addresses."""

    hostname: str
    data_dir: Path
    log_path: Path
    namespace: str = ""
    gateway: str = ""  # the root namespace's address on this host's link: where its servers are
    proc: subprocess.Popen[bytes] | None = None
    forwarders: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def node(self) -> str:
        """The worker's node name, as the worker records it on runs and journal events."""
        return f"w1@{self.hostname}"

    def reach(self, url: str) -> str:
        """How this host addresses a server the root namespace has on loopback at url."""
        return with_host(url, self.gateway) if self.gateway else url

    def forward(self, port: int) -> None:
        """Carry connections to the gateway's port to the same port on loopback."""
        assert self.gateway
        proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={self.gateway},reuseaddr,fork", f"TCP:127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.forwarders.append(proc)

        def listening() -> bool:
            assert proc.poll() is None, f"socat for port {port} exited"
            with contextlib.suppress(OSError), socket.create_connection((self.gateway, port), timeout=0.5):
                return True
            return False

        wait_until(listening, timeout=10, what=f"socat on {self.gateway}:{port}")

    def start(self, redis_url: str, env: dict[str, str]) -> None:
        """The production worker command, two processes (WORKER_CONCURRENCY=2), not waiting for it."""
        environment = child_env(self.reach(redis_url), **env)
        environment.update(
            DATABASE_URL=self.reach(shared_database_url()),
            OPENAI_BASE_URL=self.reach(env["OPENAI_BASE_URL"]),
            AGORA_DATA_DIR=str(self.data_dir),
            WORKER_NAME="w1",
            WORKER_CONCURRENCY="2",
        )
        argv = production.argv("worker", environment)
        if self.namespace:
            # The hostname is set inside the new UTS namespace; `%h` in the command then expands to it.
            argv = ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c",
                    f"hostname {shlex.quote(self.hostname)} && exec \"$@\"", "sh", *argv]  # fmt: skip
        else:
            argv = [word.replace("@%h", f"@{self.hostname}") for word in argv]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=BASE_DIR, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def answers(self, app: Any) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker on {self.hostname} exited early:\n{self.log_path.read_text()}")
        return bool(app.control.ping(destination=[self.node], timeout=0.3))

    def kill(self) -> None:
        """kill -9 the worker's whole process group, as when the host dies."""
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=2)
        for forwarder in self.forwarders:
            stop_process(forwarder, grace=1)


class WorkerHosts:
    """`count` worker hosts sharing only the test database, Redis and the model server over the network."""

    def __init__(self, count: int, logdir: Path, *, ports: list[int]) -> None:
        self.run_id = uuid.uuid4().hex[:6]
        self.unavailable = netns_unavailable()
        self.mode = PROCESSES if self.unavailable else NETNS
        self.root = Path(tempfile.mkdtemp(prefix=f"agora-hosts-{self.run_id}-"))
        self.hosts: list[WorkerHost] = []
        self.namespaces: list[str] = []
        try:
            subnet = "" if self.unavailable else free_subnet()
            for i in range(count):
                name = f"agora-{self.run_id}-{'abcdefgh'[i]}"
                host = WorkerHost(hostname=name, data_dir=self.root / name, log_path=logdir / f"{name}.log")
                host.data_dir.mkdir()
                self.hosts.append(host)
                if subnet:
                    self.link(host, i, subnet)
                    for port in ports:
                        host.forward(port)
        except BaseException:
            self.close()
            raise

    def link(self, host: WorkerHost, i: int, subnet: str) -> None:
        """A namespace for the host and a /30 between it and the root namespace."""
        namespace, outside, inside = host.hostname, f"ag{self.run_id}r{i}", f"ag{self.run_id}n{i}"
        gateway, address = f"{subnet}.{4 * i + 1}", f"{subnet}.{4 * i + 2}"
        ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", namespace)
        ip("addr", "add", f"{gateway}/30", "dev", outside)
        ip("link", "set", outside, "up")
        ip("-n", namespace, "addr", "add", f"{address}/30", "dev", inside)
        ip("-n", namespace, "link", "set", inside, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        host.namespace, host.gateway = namespace, gateway

    def describe(self) -> str:
        if self.mode == NETNS:
            links = ", ".join(f"{h.hostname} via {h.gateway}" for h in self.hosts)
            return f"worker hosts as {NETNS} ({links})"
        return f"worker hosts as {PROCESSES} ({', '.join(h.node for h in self.hosts)}): {self.unavailable}"

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)  # its veth pair goes with it
        shutil.rmtree(self.root, ignore_errors=True)
