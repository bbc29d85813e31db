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

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken
from gateways.a2a import conversation, history, mapping, push
from gateways.a2a.mapping import SETTLED, TERMINAL, task_of
from sagas import actions, errors
from sagas.models import AgentRequest, Collaborator
from sagas.waits import Doorbell, WaitSlot, hold_wait, release_connections
from sagas.wakeups import request_channel, steering_channel

T = TypeVar("T")
CALLER = "agora.caller"
PAGE_SIZE, MAX_PAGE_SIZE = 50, 100
RECHECK_S = 1.0  # how long a lost ring can delay a blocking send
SLOT_RENEW_S = 30.0  # a stream renews its wait slot this often (a slot lapses after 60 s at the least)
FOLLOW_RECHECK_S = 0.5  # how late a stream may learn that the agent took the task up (no ring for that)


@dataclass(frozen=True)
class Caller:
    """Who calls (the authenticated principal's agent in the saga) and whom (the exposed agent)."""

    sender: Collaborator
    agent: Collaborator
    token_id: int | None = None  # the API token it authenticated with: a stream ends once it is revoked


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
    if isinstance(exc, errors.TooManyWaits):
        # The spec's class for a server that refuses for lack of capacity (rate limits included) is
        # the system error, -32603; the data's code says which limit, so a client may retry later.
        return InternalError(message=exc.detail, data=data)
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
        raise TaskNotFoundError(message=f"Task {task_id} not found.")
    return request


MAX_MESSAGE_ID = 196  # "a2a:" and it fill an idempotency key (200)
MAX_PAGE_OFFSET = 2**31 - 1


def default_context_id(caller: Caller, message_id: str) -> str:
    # Derived, not random: a retried message without a contextId must hash to the same request.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"agora:{caller.sender.pk}:{message_id}"))


@transaction.atomic  # the message and its webhook, or neither (a task's webhooks may be full)
def send(caller: Caller, params: pb.SendMessageRequest, *, mode: str) -> AgentRequest:
    message = params.message
    if message.role == pb.ROLE_AGENT:
        raise InvalidParamsError(message="A client's message has the user role.")
    if len(message.message_id) > MAX_MESSAGE_ID:  # it keys the request: a2a:<messageId>
        raise InvalidParamsError(message=f"A messageId has at most {MAX_MESSAGE_ID} characters.")
    if params.configuration.HasField("task_push_notification_config"):  # refused before any task is created
        push.check(params.configuration.task_push_notification_config)
    if message.task_id:  # a further message to a task: an answer to the agent, or a follow-up
        request = conversation.continue_task(caller.sender, task_for(caller, message.task_id), message)
    else:
        request = new_task(caller, message, mode=mode)
    if params.configuration.HasField("task_push_notification_config"):
        push.register(caller, request, params.configuration.task_push_notification_config)
    return request


def new_task(caller: Caller, message: pb.Message, *, mode: str) -> AgentRequest:
    context_id = message.context_id or default_context_id(caller, message.message_id)
    payload = mapping.payload_of(message, context_id=context_id)
    request, _ = actions.ask_agent(
        sender=caller.sender, to=caller.agent.handle, type=mapping.REQUEST_TYPE, payload=payload, mode=mode,
        idempotency_key=f"a2a:{message.message_id}",
    )  # fmt: skip
    return request


def reload(request_id: str) -> AgentRequest:
    return AgentRequest.objects.select_related("sender", "recipient").get(pk=request_id)


@dataclass(frozen=True)
class Snapshot:
    """A task as it stands: its request and the agent's open question about it, if any."""

    request: AgentRequest
    question: AgentRequest | None
    history: list[dict[str, Any]] | None = None  # the whole conversation, when it was read

    @property
    def state(self) -> int:
        return mapping.state_of(self.request, self.question)

    def task(self, *, history_length: int | None = None) -> pb.Task:
        return task_of(self.request, question=self.question, history=self.history, history_length=history_length)


def snapshot(request_id: str) -> Snapshot:
    request = reload(request_id)
    return Snapshot(request, conversation.question_of(request))


def with_history(request: AgentRequest, history_length: int | None) -> Snapshot:
    """The task with its conversation (two queries), or without it when none is asked for."""
    talk = history.load([request], with_history=history_length != 0)
    return Snapshot(request, talk.questions.get(request.pk), talk.histories.get(request.pk))


def settled_view(request_id: str, history_length: int | None) -> Snapshot:
    return with_history(reload(request_id), history_length)


def as_sent(request: AgentRequest) -> Snapshot:
    return Snapshot(request, conversation.question_of(request))


def wait_deadline(request: AgentRequest) -> datetime:
    """Until when a blocking send waits: the request's own wait, or (for a further message to a
    task, whose request was sent earlier) the default wait from now."""
    if request.wait_deadline is not None:
        return request.wait_deadline
    return timezone.now() + timedelta(seconds=min(settings.AGORA_DEFAULT_WAIT_S, settings.AGORA_MAX_WAIT_S))


def settled(caller: Caller, request_id: str, deadline: datetime) -> float:
    """One look at a blocking send: 0 when it is over (the task ended, the agent asked back, or
    the wait's deadline passed), else how long the wait may still last. Refused once what
    authorized the send no longer holds, as a stream is (check_allowed): nothing more to read. It
    is checked after the read, so that a reply committed after a withdrawal is never read as still
    allowed (checked first, both could commit between the check and the read)."""
    now = timezone.now()
    view = snapshot(request_id)
    check_allowed(caller)
    if view.state not in SETTLED and deadline > now:
        return (deadline - now).total_seconds()
    if view.request.is_open:  # the task goes on; the caller answers, polls or subscribes
        actions.end_wait(request_id=request_id)
    return 0


@transaction.atomic
def cancel(caller: Caller, task_id: str) -> AgentRequest:
    """The task is cancelled and its open questions declined together: a crash between them would
    leave questions about a cancelled task waiting for an answer that cannot come."""
    request = task_for(caller, task_id)
    if not request.is_open:  # cancelled included: the spec's not-cancelable error, not the task again
        raise TaskNotCancelableError(message=f"Task {task_id} is already {request.status}.")
    questions = conversation.all_questions_of(request)
    try:
        cancelled = actions.cancel_request(request_id=task_id, by=caller.sender.user)
    except (errors.AlreadyAnswered, errors.RequestClosed) as exc:  # it ended meanwhile
        raise TaskNotCancelableError(message=exc.detail) from exc
    conversation.decline_questions(caller.sender, questions)
    return cancelled


def list_tasks(caller: Caller, params: pb.ListTasksRequest) -> pb.ListTasksResponse:
    page_size = params.page_size if params.HasField("page_size") else PAGE_SIZE
    if not 0 < page_size <= MAX_PAGE_SIZE:
        raise InvalidParamsError(message=f"pageSize must be between 1 and {MAX_PAGE_SIZE}.")
    try:
        offset = int(params.page_token or 0)
    except ValueError:
        offset = -1
    if not 0 <= offset <= MAX_PAGE_OFFSET:
        raise InvalidParamsError(message="Bad pageToken.")
    if params.HasField("history_length") and params.history_length < 0:
        raise InvalidParamsError(message="historyLength must not be negative.")
    requests = AgentRequest.objects.filter(sender=caller.sender, recipient=caller.agent, type=mapping.REQUEST_TYPE)
    if params.context_id:
        requests = requests.filter(payload__context_id=params.context_id)
    if params.status == pb.TASK_STATE_INPUT_REQUIRED:  # derived: an open task the agent asked about
        requests = requests.filter(pk__in=conversation.asking_tasks(caller.sender.pk, caller.agent.pk))
    elif params.status:
        refused = requests.filter(status=AgentRequest.Status.FAILED, error__code=mapping.REFUSED)
        if params.status == pb.TASK_STATE_REJECTED:  # derived: failed, with the agent's refusal
            requests = refused
        else:
            requests = requests.filter(status__in=mapping.STATUSES_OF_STATE.get(params.status, []))
        if params.status == pb.TASK_STATE_FAILED:  # a refusal is a rejected task, not a failed one
            requests = requests.exclude(pk__in=refused.values("pk"))
        if params.status in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING):
            requests = requests.exclude(pk__in=conversation.asking_tasks(caller.sender.pk, caller.agent.pk))
    if params.HasField("status_timestamp_after"):
        after: datetime = params.status_timestamp_after.ToDatetime(tzinfo=UTC)
        requests = requests.filter(updated_at__gt=after)
    total = requests.count()
    newest_first = requests.select_related("sender", "recipient").order_by("-updated_at", "-pk")
    page = list(newest_first[offset : offset + page_size])
    length = params.history_length if params.HasField("history_length") else None
    talk = history.load(page, with_history=length != 0)
    tasks = [
        task_of(
            r,
            question=talk.questions.get(r.pk),
            history=talk.histories.get(r.pk),
            history_length=length,
            artifacts=params.include_artifacts,
        )
        for r in page
    ]
    more = offset + len(page) < total
    return pb.ListTasksResponse(
        tasks=tasks, page_size=len(tasks), total_size=total, next_page_token=str(offset + len(page)) if more else ""
    )


def get(caller: Caller, task_id: str, history_length: int | None = None) -> Snapshot:
    return with_history(task_for(caller, task_id), history_length)


# --- the handler ----------------------------------------------------------------------------------


def history_length(params: Any) -> int | None:
    if not params.HasField("history_length"):
        return None
    if params.history_length < 0:
        raise InvalidParamsError(message="historyLength must not be negative.")
    return int(params.history_length)


async def release(slot: WaitSlot | None) -> None:
    """Give the wait's slot back, even from a stream the client hung up on: the server cancels
    that stream's task, and a cancelled scope would cancel this await too."""
    if slot is not None:
        with anyio.CancelScope(shield=True):
            await sync_to_async(slot.release)()


class KernelRequestHandler(RequestHandler):
    """Blocking sends and streams each hold one of the HTTP waits an agent and a saga may have in
    progress (`sagas.waits.hold_wait`), as the REST API's do, taken before anything is written."""

    async def on_message_send(self, params: pb.SendMessageRequest, context: ServerCallContext) -> pb.Task:
        caller = caller_of(context)
        blocking = not params.configuration.return_immediately
        mode = AgentRequest.Mode.WAIT if blocking else AgentRequest.Mode.ASYNC
        history = history_length(params.configuration)
        slot = await in_thread(hold_wait, caller.sender) if blocking else None
        try:
            # Subscribe first, then write and read: whatever is committed after still rings or is read.
            channels = (steering_channel(caller.sender.pk),)  # where the agent's questions ring
            async with Doorbell(*channels) as bell:
                request = await in_thread(send, caller, params, mode=mode)
                if blocking:
                    await bell.listen(request_channel(request.pk))
                    deadline = wait_deadline(request)
                    while remaining := await in_thread(settled, caller, request.pk, deadline):
                        await bell.ring_or_timeout(max(0.01, min(RECHECK_S, remaining)))
        finally:
            await release(slot)
        # Returning at once: the task as the send left it (a fast agent may have finished since).
        view = await in_thread(settled_view, request.pk, history) if blocking else await in_thread(as_sent, request)
        return view.task(history_length=history)

    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task | None:
        history = history_length(params)
        view = await in_thread(get, caller_of(context), params.id, history)
        return view.task(history_length=history)

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
        slot = await in_thread(hold_wait, caller.sender)
        try:
            request = await in_thread(send, caller, params, mode=AgentRequest.Mode.ASYNC)
            async for event in follow(caller, request.pk, history_length=history, slot=slot):
                yield event
        finally:
            await release(slot)

    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = caller_of(context)
        request = await in_thread(task_for, caller, params.id)
        if mapping.state_of(request) in TERMINAL:
            raise UnsupportedOperationError(message=f"Task {request.pk} is {request.status}: nothing more will come.")
        slot = await in_thread(hold_wait, caller.sender)
        try:
            async for event in follow(caller, request.pk, slot=slot):
                yield event
        finally:
            await release(slot)

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


def check_allowed(caller: Caller) -> None:
    """What authorized a wait or a stream still holds: its token, and the agent's exposure (checked
    at each re-check, as a REST wait checks its token)."""
    token_holds = caller.token_id is None or ApiToken.objects.filter(pk=caller.token_id).exists()
    if not (token_holds and Collaborator.objects.filter(pk=caller.agent.pk, exposed=True).exists()):
        raise InvalidRequestError(message="The caller's token was revoked, or the agent is no longer exposed.")


async def follow(
    caller: Caller, request_id: str, *, history_length: int | None = None, slot: WaitSlot | None = None
) -> AsyncGenerator[Event]:
    """A task's events: the task as it stands, then a status update for each change of state
    (working when the agent takes it up, input-required when it asks back), the reply as an
    artifact, the final status. It closes at a terminal or interrupted state, as the spec says.

    It subscribes before it reads, so nothing committed in between is missed; a client that drops
    and subscribes again gets the task as it stands and then the changes from there on.
    """
    async with Doorbell(request_channel(request_id), steering_channel(caller.sender.pk)) as bell:
        view = await in_thread(settled_view, request_id, history_length)
        yield view.task(history_length=history_length)
        state = view.state
        renew_at = time.monotonic() + SLOT_RENEW_S
        while state not in SETTLED:
            await bell.ring_or_timeout(FOLLOW_RECHECK_S)
            if slot is not None and time.monotonic() >= renew_at:  # a stream may last longer than a slot
                await in_thread(slot.renew)
                renew_at = time.monotonic() + SLOT_RENEW_S
            view = await in_thread(snapshot, request_id)
            await in_thread(check_allowed, caller)  # after the read, as settled() checks
            if view.state == state:
                continue
            state = view.state
            if view.request.status == AgentRequest.Status.COMPLETED:
                yield mapping.artifact_event(view.request)
            yield mapping.status_event(view.request, view.question)
