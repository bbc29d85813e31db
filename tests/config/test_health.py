import pytest
from django.test import Client

from tests.support import CeleryWorker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def health(client: Client) -> tuple[int, dict[str, str]]:
    response = client.get("/healthz")
    return response.status_code, response.json()


def test_healthz_is_ok_with_a_worker_and_503_once_it_stops(client: Client, celery_worker: CeleryWorker) -> None:
    assert health(client) == (200, {"db": "ok", "redis": "ok", "worker": "ok"})

    celery_worker.stop()

    wait_until(lambda: health(client)[0] == 503, what="healthz to report the worker down")
    assert health(client) == (503, {"db": "ok", "redis": "ok", "worker": "down"})


def test_healthz_names_redis_when_it_does_not_answer(client: Client, settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1

    assert health(client) == (503, {"db": "ok", "redis": "down", "worker": "down"})
