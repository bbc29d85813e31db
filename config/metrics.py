"""What an operator graphs, in Prometheus' text format, through `prometheus-client`.

Counters and histograms are counted in the process where things happen (a Celery pool process
runs turns, the reconciler reclaims leases, a web process hands replies to external agents), by an
in-process increment: no database statement and no Redis command on the hot path. With
PROMETHEUS_MULTIPROC_DIR set (as `make run` and production set it) every process of a host writes
its counts to its own file in that directory and a scrape adds them up (the library's
multiprocess mode). Gauges of the whole system (runs by status, queue depth, live workers) are read
at scrape time, by the web process's `/metrics` only.

    python -m config.metrics_dir reset   # on each host, before its services start (config/production.py)
"""

import hmac
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from config.metrics_dir import MULTIPROC_ENV, reset

__all__ = ["MULTIPROC_ENV", "reset"]  # with what is defined below

logger = logging.getLogger(__name__)

if os.environ.get(MULTIPROC_ENV):
    # A process's first increment opens its file there: a missing directory would fail that turn.
    Path(os.environ[MULTIPROC_ENV]).mkdir(parents=True, exist_ok=True)

# Round trips run from milliseconds (two internal agents) to minutes (a person in the chain).
ROUND_TRIP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
MODEL_CALL_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120)
MAX_LABEL_CHARS = 100  # a model id is an operator's configuration, but nobody graphs a novel

TURNS = Counter(
    "agora_turns",
    "Turns of internal runs, by how they ended: continued (the same task goes on with the next), "
    "queued (for any worker), idle, waiting (parked on a request), completed, failed, lost (the "
    "lease was taken over).",
    ["outcome"],
)
ROUND_TRIPS = Histogram(
    "agora_round_trip_seconds",
    "ask_agent round trips, from the request's creation to the sender taking in the reply (a turn "
    "of an internal sender, or an external sender's steering read); status completed or failed.",
    ["status"],
    buckets=ROUND_TRIP_BUCKETS,
)
LEASE_RECLAIMS = Counter(
    "agora_lease_reclaims", "Turns whose lease lapsed (a dead or stuck worker), queued again by the reconciler."
)
WAKEUPS_RERUNG = Counter(
    "agora_wakeups_rerung",
    "Runs the reconciler found queued with no turn under way (a lost or late doorbell, a reclaimed "
    "lease, a passed wait) and rang again.",
)
MODEL_CALLS = Histogram(
    "agora_model_call_seconds",
    "Model calls (each candidate of a fallback chain, and the router's), by model and outcome (ok, error).",
    ["model", "outcome"],
    buckets=MODEL_CALL_BUCKETS,
)
MODEL_ERRORS = Counter(
    "agora_model_call_errors",
    "Failed model calls, by model and error class (the provider's exception class).",
    ["model", "error_class"],
)


def label(value: str) -> str:
    return value[:MAX_LABEL_CHARS]


def turn_ended(outcome: str) -> None:
    TURNS.labels(outcome=outcome).inc()


def round_trip_taken(status: str, seconds: float) -> None:
    ROUND_TRIPS.labels(status=status).observe(max(seconds, 0.0))


def model_call_done(model: str, seconds: float, *, error_class: str = "") -> None:
    MODEL_CALLS.labels(model=label(model), outcome="error" if error_class else "ok").observe(seconds)
    if error_class:
        MODEL_ERRORS.labels(model=label(model), error_class=label(error_class)).inc()


# --- exposition ----------------------------------------------------------------------------------

# Gauges read at scrape time, provided by the apps that own their data (as sagas provides the runs
# by status): config cannot import them.
_scrape_collectors: list[Callable[[], Collector]] = []


def provide_scrape_collector(make: Callable[[], Collector]) -> None:
    if make not in _scrape_collectors:
        _scrape_collectors.append(make)


class _ThisProcess(Collector):
    """Without a multiprocess directory: this process's own counts (a single-process server)."""

    def collect(self) -> Iterable[object]:  # type: ignore[override]
        return REGISTRY.collect()


def process_registry(multiproc_dir: str | None) -> CollectorRegistry:
    """The counts of every process on this host (the directory's files), or of this process alone."""
    registry = CollectorRegistry()
    if multiproc_dir:
        MultiProcessCollector(registry, path=multiproc_dir)
    else:
        registry.register(_ThisProcess())
    return registry


def scrape_registry(multiproc_dir: str | None) -> CollectorRegistry:
    """What `/metrics` exposes: this host's counts and the system's gauges, read now."""
    registry = process_registry(multiproc_dir)
    for make in _scrape_collectors:
        registry.register(make())
    return registry


def bearer_token_matches(authorization: str, token: str) -> bool:
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def start_worker_exporter() -> None:
    """On a worker host, with METRICS_PORT set: the library's own HTTP server in the worker's main
    process, serving the counts of every process of the host (METRICS_HOST, default loopback)."""
    port = os.environ.get("METRICS_PORT")
    if not port:
        return
    multiproc_dir = os.environ.get(MULTIPROC_ENV)
    if not multiproc_dir:
        # The pool processes' counts would be invisible to this one: say so rather than serve zeros.
        logger.error("METRICS_PORT is set but %s is not: the worker serves no metrics", MULTIPROC_ENV)
        return
    host = os.environ.get("METRICS_HOST", "127.0.0.1")
    start_http_server(int(port), addr=host, registry=process_registry(multiproc_dir))
    logger.info("metrics of this host's processes on http://%s:%s/metrics", host, port)


def process_exited(pid: int) -> None:
    """The library's bookkeeping for a process of the host that ends (a Celery pool process)."""
    if os.environ.get(MULTIPROC_ENV):
        mark_process_dead(pid)
