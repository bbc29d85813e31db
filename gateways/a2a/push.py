"""Push notifications: a client's webhooks for its task, and their delivery with retries.

Registration is the gateway's own write (its PushConfig rows); delivery is a thin Celery task
(`gateways.a2a.tasks.push_task`) that looks at the task, posts its state when it changed, records
what the webhook took, and comes back later: soon after a failure (with backoff), a little later
while the task is open, never once the final state is delivered.
"""

import uuid
from datetime import timedelta
from urllib.parse import urlsplit

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from django.db import transaction

from gateways.a2a.models import PushConfig
from sagas.models import AgentRequest

ENABLED = True
PUSH_TASK = "gateways.a2a.tasks.push_task"
MAX_CONFIGS = 10  # per task


def as_proto(config: PushConfig) -> pb.TaskPushNotificationConfig:
    message = pb.TaskPushNotificationConfig(
        id=config.config_id, task_id=config.request_id, url=config.url, token=config.token
    )
    if config.auth_scheme:
        message.authentication.scheme = config.auth_scheme
    return message  # credentials are never read back


def check(config: pb.TaskPushNotificationConfig) -> None:
    """A webhook's config as its row holds it; checked before its task is created (SendMessage)."""
    if not reachable(config.url):
        raise InvalidParamsError(message="A push notification url is an http(s) URL.")
    for field, value in (("config_id", config.id), ("url", config.url), ("token", config.token),
                         ("auth_scheme", config.authentication.scheme),
                         ("auth_credentials", config.authentication.credentials)):  # fmt: skip
        limit = PushConfig._meta.get_field(field).max_length or 0  # type: ignore[union-attr]
        if len(value) > limit or "\x00" in value:
            raise InvalidParamsError(
                message=f"The push notification config's {field} is not {limit} characters or fewer."
            )


def reachable(url: str) -> bool:
    """An http(s) URL a request could go to: a host a resolver takes, a port if any, no spaces."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number, or out of range: ValueError)
        (parts.hostname or "").encode("idna")  # a label no resolver takes: UnicodeError, a ValueError
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in url)


def register(
    caller: object, request: AgentRequest, config: pb.TaskPushNotificationConfig
) -> pb.TaskPushNotificationConfig:
    """Add (or replace, by id) a webhook for this task, and ring its delivery after commit. Without an
    id, the id derives from the task and the url: a retried SendMessage replaces its webhook, not adds
    another."""
    check(config)
    config_id = config.id or uuid.uuid5(uuid.NAMESPACE_URL, f"{request.pk}:{config.url}").hex
    webhook = {
        "url": config.url,
        "token": config.token,
        "auth_scheme": config.authentication.scheme,
        "auth_credentials": config.authentication.credentials,
    }
    with transaction.atomic():
        if PushConfig.objects.filter(request=request).exclude(config_id=config_id).count() >= MAX_CONFIGS:
            raise InvalidParamsError(message=f"A task takes at most {MAX_CONFIGS} push notification configs.")
        row = PushConfig.objects.select_for_update().filter(request=request, config_id=config_id).first()
        if row is not None and all(getattr(row, field) == value for field, value in webhook.items()):
            return as_proto(row)  # set again as it is (a retried send): its deliveries go on as they were
        row, _ = PushConfig.objects.update_or_create(
            request=request, config_id=config_id, defaults={**webhook, "pushed_state": "", "failures": 0}
        )
        transaction.on_commit(lambda: ring(row.pk))
    return as_proto(row)


def ring(config_pk: int, *, delay_s: float = 0) -> None:
    from celery import current_app

    current_app.send_task(PUSH_TASK, args=[config_pk], countdown=delay_s or None)


def get(request: AgentRequest, config_id: str) -> pb.TaskPushNotificationConfig:
    row = PushConfig.objects.filter(request=request, config_id=config_id).first()
    if row is None:
        raise TaskNotFoundError(message=f"No push notification config {config_id} for task {request.pk}.")
    return as_proto(row)


def list_for(request: AgentRequest) -> pb.ListTaskPushNotificationConfigsResponse:
    rows = PushConfig.objects.filter(request=request).order_by("created_at", "pk")
    return pb.ListTaskPushNotificationConfigsResponse(configs=[as_proto(row) for row in rows])


def delete(caller: object, request: AgentRequest, config_id: str) -> None:
    PushConfig.objects.filter(request=request, config_id=config_id).delete()


# --- delivery (the Celery task's steps) ----------------------------------------------------------

OPEN_POLL_S = (0.5, 1, 2, 5)  # how soon to look again at an open task, growing while nothing changes
MAX_FAILURES = 6
BACKOFF_S = 0.5  # 0.5, 1, 2, 4, 8 s between failed attempts


def backoff(failures: int) -> timedelta:
    return timedelta(seconds=BACKOFF_S * 2 ** max(0, failures - 1))


def record_pushed(config_pk: int, *, seen: str, state: str) -> bool:
    """Compare-and-set: the webhook took `state`, if nobody recorded another since `seen`."""
    return bool(
        PushConfig.objects.filter(pk=config_pk, pushed_state=seen).update(pushed_state=state, failures=0, last_error="")
    )


def record_failure(config_pk: int, *, error: str) -> int:
    with transaction.atomic():
        row = PushConfig.objects.select_for_update().filter(pk=config_pk).first()
        if row is None:
            return MAX_FAILURES
        row.failures += 1
        row.last_error = error[:2000]
        row.save(update_fields=["failures", "last_error"])
        return row.failures
