"""`/healthz`: is the database answering, is Redis answering, has a Celery worker beaten lately.

Cheap enough to probe often under load: one `SELECT 1` and one Redis command (which both proves
Redis answers and counts the workers whose main loop beat within the last seconds,
config/liveness.py), each bounded by a short timeout. No broadcast to the workers.
"""

import logging

from django.db import connection
from django.db.utils import Error as DatabaseError
from django.http import HttpRequest, JsonResponse
from redis.exceptions import RedisError

from config import liveness

logger = logging.getLogger(__name__)


def check_db() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError:
        return False


def check_redis_and_workers() -> dict[str, bool]:
    try:
        workers = liveness.live_workers()
    except (RedisError, OSError):
        return {"redis": False, "worker": False}  # no Redis, no way to tell: reported down
    return {"redis": True, "worker": workers > 0}


def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"db": check_db(), **check_redis_and_workers()}
    body = {name: "ok" if ok else "down" for name, ok in checks.items()}
    response = JsonResponse(body, status=200 if all(checks.values()) else 503)
    if response.status_code == 503:
        # A 503 here is an answer, not a server error: a stack that is booting (or a worker that
        # is away) is waited on by `make run` and load balancers. Logged as information, once;
        # Django would otherwise log every 5xx as an ERROR (django.request).
        logger.info("healthz: %s", ", ".join(f"{name} {state}" for name, state in body.items()))
        response._has_been_logged = True  # type: ignore[attr-defined]  # read by django.utils.log.log_response
    return response
