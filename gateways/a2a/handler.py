"""The A2A request handler backed by the kernel.

The SDK's JSON-RPC dispatcher parses, validates and answers with the protocol's error codes; this
handler does what each method means in Agora: `SendMessage` is `ask_agent` from the caller's agent
to the exposed agent (blocking is `wait`, return-immediately is `async`, the message id is the
idempotency key), `GetTask`/`ListTasks` read the caller's requests to that agent, `CancelTask`
cancels through the kernel, and streams follow the saga's journal.

The SDK's DefaultRequestHandler runs an executor in the web process and keeps a task's events in
memory queues; here the work is a durable request run by Celery workers, so the state always comes
from the database and any web process can answer for any task.
"""

import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from asgiref.sync import sync_to_async
from django.utils import timezone

from gateways.a2a import mapping, push
from gateways.a2a.mapping import TERMINAL, task_of
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.models import AgentRequest, Collaborator
from sagas.waits import Doorbell, release_connections
from sagas.wakeups import request_channel

T = TypeVar("T")
CALLER = "agora.caller"
PAGE_SIZE, MAX_PAGE_SIZE = 50, 100
RECHECK_S = 1.0  # how long a lost ring can delay a blocking send
FOLLOW_RECHECK_S = 0.5  # how late a stream may learn that the agent took the task up (no ring for that)


@dataclass(frozen=True)
class Caller:
    """Who calls (the authenticated principal's agent in the saga) and whom (the exposed agent)."""

    sender: Collaborator
    agent: Collaborator


def caller_of(context: ServerCallContext) -> Caller:
    caller = context.state.get(CALLER)
    if not isinstance(caller, Caller):  # the ASGI app authorizes before dispatching: never reached
        raise InvalidRequestError(message="Not authenticated.")
    return caller


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run kernel code in a worker thread, translating kernel errors into the protocol's, and give
    the database connection back: a stream or a wait must not hold one while it waits."""

    def call() -> T:
        try:
            return fn(*args, **kwargs)
        except errors.KernelError as exc:
            raise protocol_error(exc) from exc
        finally:
            release_connections()

    return await sync_to_async(call)()


def protocol_error(exc: errors.KernelError) -> A2AError:
    data = {"code": exc.code, **{k: v for k, v in exc.extra.items() if k != "errors"}}
    if isinstance(exc, errors.NotFound):
        return TaskNotFoundError(message=exc.detail, data=data)
    if isinstance(exc, errors.InvalidPayload | errors.PayloadTooLarge | errors.IdempotencyConflict):
        return InvalidParamsError(message=exc.detail, data=data)
    # The kernel's refusals (not addressable, hop limit, too many pending, deadlock, unavailable…)
    return InvalidRequestError(message=exc.detail, data=data)


# --- kernel calls (sync, in a thread) -------------------------------------------------------------


def task_for(caller: Caller, task_id: str) -> AgentRequest:
    """One of the caller's tasks with this agent; any other id is not found, whoever's it is."""
    request = (
        AgentRequest.objects.filter(pk=task_id, sender=caller.sender, recipient=caller.agent)
        .select_related("sender", "recipient")
        .first()
    )
    if request is None:
        raise TaskNotFoundError(message=f"No task {task_id}.")
    return request


def default_context_id(caller: Caller, message_id: str) -> str:
    # Derived, not random: a retried message without a contextId must hash to the same request.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"agora:{caller.sender.pk}:{message_id}"))


def send(caller: Caller, params: pb.SendMessageRequest, *, mode: str) -> AgentRequest:
    message = params.message
    if message.task_id:
        earlier = task_for(caller, message.task_id)
        if mapping.state_of(earlier) in TERMINAL:
            raise UnsupportedOperationError(message=f"Task {earlier.pk} is {earlier.status}; start a new task.")
        raise UnsupportedOperationError(message="A task takes one message; send a new one without taskId.")
    if message.role == pb.ROLE_AGENT:
        raise InvalidParamsError(message="A client's message has the user role.")
    context_id = message.context_id or default_context_id(caller, message.message_id)
    payload = mapping.payload_of(message, context_id=context_id)
    request, _ = actions.ask_agent(
        sender=caller.sender, to=caller.agent.handle, type=mapping.REQUEST_TYPE, payload=payload, mode=mode,
        idempotency_key=f"a2a:{message.message_id}",
    )  # fmt: skip
    if params.configuration.HasField("task_push_notification_config"):
        push.register(caller, request, params.configuration.task_push_notification_config)
    return request


def reload(request_id: str) -> AgentRequest:
    return AgentRequest.objects.select_related("sender", "recipient").get(pk=request_id)


def settled(request_id: str) -> float:
    """One look at a blocking send: 0 when it is over (the request ended, or the sender's wait did),
    else how long the wait may still last."""
    request = AgentRequest.objects.get(pk=request_id)
    if not request.is_open:
        return 0
    now = timezone.now()
    if request.wait_deadline is not None and request.wait_deadline > now:
        return (request.wait_deadline - now).total_seconds()
    actions.end_wait(request_id=request_id)  # the task goes on; the caller polls or subscribes
    return 0


def cancel(caller: Caller, task_id: str) -> AgentRequest:
    request = task_for(caller, task_id)
    if not request.is_open and request.status != AgentRequest.Status.CANCELLED:
        raise TaskNotCancelableError(message=f"Task {task_id} is already {request.status}.")
    try:
        return actions.cancel_request(request_id=task_id, by=caller.sender.user)
    except (errors.AlreadyAnswered, errors.RequestClosed) as exc:  # it ended meanwhile
        raise TaskNotCancelableError(message=exc.detail) from exc


def list_tasks(caller: Caller, params: pb.ListTasksRequest) -> pb.ListTasksResponse:
    page_size = params.page_size if params.HasField("page_size") else PAGE_SIZE
    if not 0 < page_size <= MAX_PAGE_SIZE:
        raise InvalidParamsError(message=f"pageSize must be between 1 and {MAX_PAGE_SIZE}.")
    try:
        offset = int(params.page_token or 0)
    except ValueError:
        offset = -1
    if offset < 0:
        raise InvalidParamsError(message="Bad pageToken.")
    if params.HasField("history_length") and params.history_length < 0:
        raise InvalidParamsError(message="historyLength must not be negative.")
    requests = AgentRequest.objects.filter(sender=caller.sender, recipient=caller.agent, type=mapping.REQUEST_TYPE)
    if params.context_id:
        requests = requests.filter(payload__context_id=params.context_id)
    if params.status:
        requests = requests.filter(status__in=mapping.STATUSES_OF_STATE.get(params.status, []))
    if params.HasField("status_timestamp_after"):
        after: datetime = params.status_timestamp_after.ToDatetime(tzinfo=UTC)
        requests = requests.filter(updated_at__gt=after)
    total = requests.count()
    newest_first = requests.select_related("sender", "recipient").order_by("-updated_at", "-pk")
    page = list(newest_first[offset : offset + page_size])
    history = params.history_length if params.HasField("history_length") else None
    tasks = [task_of(r, history_length=history, artifacts=params.include_artifacts) for r in page]
    more = offset + len(page) < total
    return pb.ListTasksResponse(
        tasks=tasks, page_size=len(tasks), total_size=total, next_page_token=str(offset + len(page)) if more else ""
    )


def journal_cursor(saga_id: Any) -> int:
    return JournalEvent.objects.filter(saga_id=saga_id).order_by("-seq").values_list("seq", flat=True).first() or 0


def request_events_after(request: AgentRequest, after: int) -> list[tuple[int, str]]:
    """The journal's events about this request after the cursor: (seq, type)."""
    events = JournalEvent.objects.for_saga(request.saga_id, after=after).filter(
        type__startswith="request.", data__request_id=request.pk
    )
    return list(events.values_list("seq", "type"))


# --- the handler ----------------------------------------------------------------------------------


def history_length(params: Any) -> int | None:
    if not params.HasField("history_length"):
        return None
    if params.history_length < 0:
        raise InvalidParamsError(message="historyLength must not be negative.")
    return int(params.history_length)


class KernelRequestHandler(RequestHandler):
    async def on_message_send(self, params: pb.SendMessageRequest, context: ServerCallContext) -> pb.Task:
        caller = caller_of(context)
        blocking = not params.configuration.return_immediately
        mode = AgentRequest.Mode.WAIT if blocking else AgentRequest.Mode.ASYNC
        history = history_length(params.configuration)
        request = await in_thread(send, caller, params, mode=mode)
        if blocking and request.is_open:
            # Subscribe first, then read: a reply committed between the two still rings or is read.
            async with Doorbell(request_channel(request.pk)) as bell:
                while remaining := await in_thread(settled, request.pk):
                    await bell.ring_or_timeout(max(0.01, min(RECHECK_S, remaining)))
            request = await in_thread(reload, request.pk)
        return task_of(request, history_length=history)

    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task | None:
        history = history_length(params)
        request = await in_thread(task_for, caller_of(context), params.id)
        return task_of(request, history_length=history)

    async def on_list_tasks(self, params: pb.ListTasksRequest, context: ServerCallContext) -> pb.ListTasksResponse:
        return await in_thread(list_tasks, caller_of(context), params)

    async def on_cancel_task(self, params: pb.CancelTaskRequest, context: ServerCallContext) -> pb.Task | None:
        request = await in_thread(cancel, caller_of(context), params.id)
        return task_of(request)

    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = caller_of(context)
        history = history_length(params.configuration)
        request = await in_thread(send, caller, params, mode=AgentRequest.Mode.ASYNC)
        async for event in follow(request.pk, history_length=history):
            yield event

    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        request = await in_thread(task_for, caller_of(context), params.id)
        if mapping.state_of(request) in TERMINAL:
            raise UnsupportedOperationError(message=f"Task {request.pk} is {request.status}: nothing more will come.")
        async for event in follow(request.pk):
            yield event

    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        caller = caller_of(context)
        request = await in_thread(task_for, caller, params.task_id)
        return await in_thread(push.register, caller, request, params)

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        caller = caller_of(context)
        request = await in_thread(task_for, caller, params.task_id)
        return await in_thread(push.get, request, params.id)

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        caller = caller_of(context)
        request = await in_thread(task_for, caller, params.task_id)
        return await in_thread(push.list_for, request)

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        caller = caller_of(context)
        request = await in_thread(task_for, caller, params.task_id)
        await in_thread(push.delete, caller, request, params.id)

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        raise ExtendedAgentCardNotConfiguredError


async def follow(request_id: str, *, history_length: int | None = None) -> AsyncGenerator[Event]:
    """A task's events as the journal records them: the task as it stands, then a status update
    for each step (working when the agent takes it up), the reply as an artifact, the final status.

    It subscribes before it reads, so nothing committed in between is missed; a client that drops
    and subscribes again gets the task as it stands and then the same events from there on.
    """
    async with Doorbell(request_channel(request_id)) as bell:
        request = await in_thread(reload, request_id)
        cursor = await in_thread(journal_cursor, request.saga_id)
        request = await in_thread(reload, request_id)  # after the cursor: an event in between shows twice, never zero
        yield task_of(request, history_length=history_length)
        state = mapping.state_of(request)
        while state not in TERMINAL:
            await bell.ring_or_timeout(FOLLOW_RECHECK_S)
            events = await in_thread(request_events_after, request, cursor)
            if not events:
                continue
            cursor = events[-1][0]
            request = await in_thread(reload, request_id)
            new_state = mapping.state_of(request)
            if new_state == state:
                continue
            state = new_state
            if request.status == AgentRequest.Status.COMPLETED:
                yield mapping.artifact_event(request)
            yield mapping.status_event(request)
