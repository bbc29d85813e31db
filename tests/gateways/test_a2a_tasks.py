"""Tasks through the gateway with the SDK's client, against daphne, a Celery worker and Redis:
the A2A task is the kernel's request, so what the client sees is what the kernel holds."""

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError, TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError
from django.db import connection
from google.protobuf.json_format import MessageToDict

from accounts.models import User
from sagas import actions
from sagas.models import AgentRequest, Run
from tests.gateways.conftest import Cast, first, message, run, send
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.integration


def data_of(task: pb.Task) -> Any:
    return MessageToDict(task.artifacts[0].parts[0])["data"]


def test_send_blocking_and_not_get_list_and_cancel(
    web_server: WebServer, celery_worker: CeleryWorker, cast: Cast
) -> None:
    wait_until(lambda: Run.objects.get(collaborator=cast.responder).status in (Run.Status.IDLE, Run.Status.COMPLETED),
               timeout=60, what="the responder's first turn")  # fmt: skip
    responder = cast.agent_url(web_server.url, "responder")

    async def blocking(client: Client) -> tuple[pb.Task, pb.Task]:
        msg = message("hi", data={"n": 7}, message_id="m-1", context_id="ctx-1")
        done = await send(client, msg)
        again = await send(client, msg)  # the same messageId: the same task, not a second request
        return done, again

    done, again = run(responder, cast.ext_token, blocking)
    assert done.status.state == pb.TASK_STATE_COMPLETED
    assert (done.id, done.context_id) == (again.id, "ctx-1")
    assert data_of(done) == {"echo": {"parts": [{"text": "hi"}, {"data": {"n": 7.0}}], "message_id": "m-1",
                                      "context_id": "ctx-1"}}  # fmt: skip
    request = AgentRequest.objects.get(pk=done.id)
    assert (request.sender.name, request.recipient.name, request.mode) == ("ext", "responder", "wait")

    async def non_blocking(client: Client) -> tuple[pb.Task, pb.Task, pb.ListTasksResponse]:
        submitted = await send(client, message("later", context_id="ctx-2"), return_immediately=True)
        for _ in range(600):
            task = await client.get_task(pb.GetTaskRequest(id=submitted.id))
            if task.status.state == pb.TASK_STATE_COMPLETED:
                break
            await asyncio.sleep(0.1)
        listed = await client.list_tasks(pb.ListTasksRequest(context_id="ctx-2", include_artifacts=True))
        return submitted, task, listed

    submitted, task, listed = run(responder, cast.ext_token, non_blocking)
    assert submitted.status.state in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING)
    assert AgentRequest.objects.get(pk=submitted.id).mode == "async"
    assert task.status.state == pb.TASK_STATE_COMPLETED and data_of(task)["echo"]["parts"] == [{"text": "later"}]
    assert [t.id for t in listed.tasks] == [submitted.id] and listed.total_size == 1

    async def all_tasks(client: Client) -> pb.ListTasksResponse:
        return await client.list_tasks(pb.ListTasksRequest(page_size=1))

    page = run(responder, cast.ext_token, all_tasks)
    assert (len(page.tasks), page.total_size, page.next_page_token) == (1, 2, "1")

    slow = cast.agent_url(web_server.url, "slow")

    async def cancel(client: Client) -> tuple[pb.Task, pb.Task, pb.Task]:
        pending = await send(client, message("take your time"), return_immediately=True)
        cancelled = await client.cancel_task(pb.CancelTaskRequest(id=pending.id))
        with pytest.raises(TaskNotCancelableError):  # a cancelled task is terminal too, says the spec
            await client.cancel_task(pb.CancelTaskRequest(id=pending.id))
        return pending, cancelled, await client.get_task(pb.GetTaskRequest(id=pending.id))

    pending, cancelled, got = run(slow, cast.ext_token, cancel)
    assert pending.status.state == pb.TASK_STATE_SUBMITTED
    assert cancelled.status.state == got.status.state == pb.TASK_STATE_CANCELED
    assert AgentRequest.objects.get(pk=pending.id).status == AgentRequest.Status.CANCELLED

    # The spec's errors: a finished task is not cancelable, an unknown one (or another agent's) is not found.
    async def errors(client: Client) -> list[type[Exception]]:
        seen: list[type[Exception]] = []
        for call in (
            lambda: client.cancel_task(pb.CancelTaskRequest(id=done.id)),
            lambda: client.get_task(pb.GetTaskRequest(id="req-nothing")),
            lambda: client.get_task(pb.GetTaskRequest(id=pending.id)),  # asked of slow, not of responder
        ):
            try:
                await call()
            except A2AError as exc:
                seen.append(type(exc))
        return seen

    assert run(responder, cast.ext_token, errors) == [TaskNotCancelableError, TaskNotFoundError, TaskNotFoundError]


def reply_and_close(request_id: str, by: User, payload: str) -> None:
    """The reply from a helper thread, which closes its own connection (or the test database could
    not be dropped on PostgreSQL while it stays open)."""
    try:
        actions.reply_to_request(request_id=request_id, by=by, payload=payload)
    finally:
        connection.close()


def test_stream_drop_and_resubscribe(web_server: WebServer, cast: Cast) -> None:
    """No worker needed: `slow` is an external agent, whose reply the test sends through the kernel."""
    slow = cast.agent_url(web_server.url, "slow")

    async def stream_then_drop(client: Client) -> pb.StreamResponse:
        request = pb.SendMessageRequest(message=message("stream me"))
        stream = client.send_message(request)
        assert isinstance(stream, AsyncGenerator)
        event = await first(stream)
        await stream.aclose()  # the client hangs up; the task goes on
        return event

    opened = run(slow, cast.ext_token, stream_then_drop, streaming=True)
    assert opened.task.status.state == pb.TASK_STATE_SUBMITTED
    task_id = opened.task.id

    async def resubscribe(client: Client) -> list[pb.StreamResponse]:
        events = []
        async for event in client.subscribe(pb.SubscribeToTaskRequest(id=task_id)):
            events.append(event)
            if len(events) == 1:  # resubscribed and given the task as it stands: now slow answers
                await asyncio.to_thread(reply_and_close, task_id, cast.slow.user, "Thought it over.")
        return events

    events = run(slow, cast.ext_token, resubscribe, streaming=True)
    assert events[0].task.id == task_id and events[0].task.status.state == pb.TASK_STATE_SUBMITTED
    assert MessageToDict(events[-2].artifact_update.artifact)["parts"] == [{"text": "Thought it over."}]
    assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED

    # A finished task has nothing more to stream: the spec's unsupported-operation error.
    async def late(client: Client) -> None:
        await first(client.subscribe(pb.SubscribeToTaskRequest(id=task_id)))

    with pytest.raises(UnsupportedOperationError):
        run(slow, cast.ext_token, late, streaming=True)
