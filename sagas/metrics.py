"""The kernel's part of the metrics (config/metrics.py): runs by status, read at scrape time with one
aggregate query, and the ask_agent round trips, counted when the sender takes the reply in."""

import logging
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import partial

from django.db import transaction
from django.db.models import Count
from django.db.utils import Error as DatabaseError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from config import metrics
from sagas.models import AgentRequest, Run, SteeringItem

logger = logging.getLogger(__name__)


class RunsByStatus(Collector):
    """Every status, zeros included, so that a series does not vanish when its last run moves on.
    Nothing when the database does not answer (`/healthz` says so)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counted = dict(Run.objects.order_by().values_list("status").annotate(n=Count("id")))
        except DatabaseError as exc:
            logger.warning("metrics: the database did not answer: %s", exc)
            return
        runs = GaugeMetricFamily("agora_runs", "Runs (internal and external) by status.", labels=["status"])
        for status in Run.Status.values:
            runs.add_metric([status], counted.get(status, 0))
        yield runs


def count_round_trips(items: Iterable[SteeringItem], *, at: datetime) -> None:
    """In the transaction that marks these items consumed: each reply among them ends the round trip
    of its request, counted once that transaction commits (an in-process increment, no statement)."""
    for item in items:
        if item.kind == SteeringItem.Kind.RESPONSE and item.request is not None:
            count_round_trip(item.request, at=at)


def count_round_trip(request: AgentRequest, *, at: datetime) -> None:
    seconds = (at - request.created_at).total_seconds()
    transaction.on_commit(partial(metrics.round_trip_taken, request.status, seconds), robust=True)
