"""The gateway's Celery task: push a task's state to a client's webhook (thin: the steps are in push)."""

import logging

import httpx
from a2a.types import a2a_pb2 as pb
from a2a.utils.push_url_validator import validate_push_notification_url
from asgiref.sync import async_to_sync
from celery import shared_task
from django.conf import settings
from google.protobuf.json_format import MessageToDict

from gateways.a2a import conversation, mapping, outbound, push
from gateways.a2a.models import PushConfig
from gateways.a2a.public_net import NotPublic, public_transport
from sagas.wakeups import REMOTE_CALL_TASK

logger = logging.getLogger(__name__)


@shared_task(name=push.PUSH_TASK, ignore_result=True)
def push_task(config_pk: int, quiet: int = 0) -> None:
    config = PushConfig.objects.select_related("request").filter(pk=config_pk).first()
    if config is None:
        return  # deleted, or its task is gone
    request = config.request
    question = conversation.question_of(request)
    state = pb.TaskState.Name(mapping.state_of(request, question))
    final = mapping.state_of(request) in mapping.TERMINAL
    if state == config.pushed_state:
        if not final:  # nothing new yet: look again, less often the longer it stays so
            push_task_later(config_pk, quiet + 1)
        return
    error = deliver(config, mapping.task_of(request, question=question))
    if error is None:
        push.record_pushed(config_pk, seen=config.pushed_state, state=state)
        if not final:
            push_task_later(config_pk, 0)
        return
    failures = push.record_failure(config_pk, error=error)
    logger.info("push to %s for %s failed (%s): %s", config.url, request.pk, failures, error)
    if failures < push.MAX_FAILURES:
        push_task.apply_async(args=(config_pk,), countdown=push.backoff(failures).total_seconds())


def push_task_later(config_pk: int, quiet: int) -> None:
    delay = push.OPEN_POLL_S[min(quiet, len(push.OPEN_POLL_S) - 1)]
    push_task.apply_async(args=(config_pk, quiet), countdown=delay)


def deliver(config: PushConfig, task: pb.Task) -> str | None:
    """POST the task to the webhook, outside any transaction; None when it took it."""
    if not settings.AGORA_A2A_PUSH_PRIVATE_URLS and not async_to_sync(validate_push_notification_url)(config.url):
        return "The webhook's address is not a public one."
    headers = {}
    if config.token:
        headers["X-A2A-Notification-Token"] = config.token
    if config.auth_scheme and config.auth_credentials:
        headers["Authorization"] = f"{config.auth_scheme} {config.auth_credentials}"
    # Connected only to the public address its host was found at (public_net), unless private ones are allowed.
    transport = None if settings.AGORA_A2A_PUSH_PRIVATE_URLS else public_transport()
    try:
        with httpx.Client(transport=transport, timeout=5) as http:
            response = http.post(config.url, json=MessageToDict(pb.StreamResponse(task=task)), headers=headers)
        response.raise_for_status()
    except NotPublic as exc:
        return str(exc)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # a row set before its URL was checked as now
        return f"{type(exc).__name__}: {exc}"
    return None


@shared_task(name=REMOTE_CALL_TASK, ignore_result=True)
def follow_remote_call(call_id: str, step: int) -> None:
    """One step of an agent's call to a remote A2A agent (thin: the steps are in outbound)."""
    outbound.follow(call_id, step)
