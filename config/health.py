"""`/healthz`: is the database answering, is Redis answering, has a Celery worker replied to a ping."""

import logging

from django.conf import settings
from django.db import connection
from django.db.utils import Error as DatabaseError
from django.http import HttpRequest, JsonResponse
from kombu.exceptions import OperationalError as BrokerError
from redis import Redis
from redis.exceptions import RedisError

from config.celery import app as celery_app

PING_TIMEOUT_S = 1.0
logger = logging.getLogger(__name__)


def check_db() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError:
        return False


def check_redis() -> bool:
    try:
        client = Redis.from_url(
            settings.REDIS_URL, socket_timeout=PING_TIMEOUT_S, socket_connect_timeout=PING_TIMEOUT_S
        )
        with client:
            return bool(client.ping())
    except (RedisError, OSError):
        return False


def check_worker() -> bool:
    try:
        return bool(celery_app.control.ping(timeout=PING_TIMEOUT_S))
    except (BrokerError, RedisError, OSError):
        return False


def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"db": check_db(), "redis": check_redis()}
    checks["worker"] = checks["redis"] and check_worker()  # no broker, no ping
    body = {name: "ok" if ok else "down" for name, ok in checks.items()}
    response = JsonResponse(body, status=200 if all(checks.values()) else 503)
    if response.status_code == 503:
        # A 503 here is an answer, not a server error: a stack that is booting (or a worker that
        # is away) is waited on by `make run` and load balancers. Logged as information, once;
        # Django would otherwise log every 5xx as an ERROR (django.request).
        logger.info("healthz: %s", ", ".join(f"{name} {state}" for name, state in body.items()))
        response._has_been_logged = True  # type: ignore[attr-defined]  # read by django.utils.log.log_response
    return response
