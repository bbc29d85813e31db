"""Reading `/metrics` in tests: the text parsed by prometheus-client's own parser."""

from collections.abc import Mapping

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "metrics-token-for-tests"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(client: Client) -> Samples:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    return parse(response.content.decode())


def value(samples: Samples, name: str, labels: Mapping[str, str] | None = None, default: float = 0.0) -> float:
    return samples.get((name, frozenset((labels or {}).items())), default)


def buckets(samples: Samples, name: str, labels: Mapping[str, str]) -> dict[str, float]:
    """A histogram's cumulative buckets, by their upper bound (`le`)."""
    wanted = set(labels.items())
    return {
        dict(key)["le"]: count
        for (sample, key), count in samples.items()
        if sample == f"{name}_bucket" and wanted <= set(key)
    }


def family(samples: Samples, name: str) -> Samples:
    """The samples of one metric (a histogram's buckets, count and sum; a counter's total)."""
    names = {name} | {name + suffix for suffix in ("_total", "_count", "_sum", "_bucket", "_created")}
    return {key: n for key, n in samples.items() if key[0] in names}
