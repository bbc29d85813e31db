"""`/metrics`: this host's counts (config/metrics.py) and the system's gauges, read at scrape time.

Who may read it: with `AGORA_METRICS_TOKEN` set, whoever sends `Authorization: Bearer <token>`;
without it, nobody, except a client on loopback while DEBUG is on (`make run`).
"""

import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.django import PrometheusDjangoView
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from config import liveness, metrics

logger = logging.getLogger(__name__)

LOOPBACK = {"127.0.0.1", "::1"}


class QueuesAndWorkers(Collector):
    """Messages waiting in each queue the workers consume (WORKER_QUEUES), and the workers that beat
    lately: one pipelined Redis round trip. Nothing when Redis does not answer (`/healthz` says so)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queues = settings.AGORA_METRICS_QUEUES
        try:
            with liveness.client().pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.llen(queue)  # tasks are sent without priorities: one list per queue
                pipe.eval(liveness.COUNT_SCRIPT, 1, liveness.KEY, str(liveness.ALIVE_S))
                *lengths, workers = pipe.execute()
        except (RedisError, OSError) as exc:
            logger.warning("metrics: Redis did not answer: %s", exc)
            return
        depth = GaugeMetricFamily(
            "agora_queue_depth", "Celery messages waiting in a queue (turns, reconciles, ...).", labels=["queue"]
        )
        for queue, length in zip(queues, lengths, strict=True):
            depth.add_metric([queue], length)
        yield depth
        yield GaugeMetricFamily(
            "agora_workers", f"Celery workers whose main loop beat within the last {liveness.ALIVE_S:g}s.", workers
        )


metrics.provide_scrape_collector(QueuesAndWorkers)


def refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the metrics, else the answer that says why not."""
    token = settings.AGORA_METRICS_TOKEN
    if token:
        if metrics.bearer_token_matches(request.headers.get("Authorization", ""), token):
            return None
        response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if settings.DEBUG and request.META.get("REMOTE_ADDR") in LOOPBACK:
        return None
    return HttpResponse("Set AGORA_METRICS_TOKEN to read the metrics.\n", status=403, content_type="text/plain")


class MetricsView(PrometheusDjangoView):
    """The library's Django view, behind the access rule above, on a registry built per scrape."""

    http_method_names = ["get", "head"]

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if (refused := refusal(request)) is not None:
            return refused
        self.registry = metrics.scrape_registry(settings.PROMETHEUS_MULTIPROC_DIR)
        response: HttpResponseBase = super().get(request, *args, **kwargs)
        return response
