"""Tasks of more than one message through the gateway, with the SDK's client against daphne, a
Celery worker and Redis: the agent asks back (input-required) and the client's answer, sent with
the task's id, reaches it as the reply to its question; a further message to a task still going
on reaches the agent as a follow-up; a finished task takes none."""

import asyncio
import threading
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InternalError, UnsupportedOperationError
from django.db import connection
from google.protobuf.json_format import MessageToDict

from agents.actions import load_profiles
from sagas import actions
from sagas.models import AgentRequest, Collaborator, Run, SteeringItem
from tests.gateways.conftest import Cast, first, message, run, send
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.integration

QUESTION = "Before I answer: what is it for?"


def text_of(msg: pb.Message) -> str:
    return " ".join(part.text for part in msg.parts)


def in_task(msg: pb.Message, task: pb.Task) -> pb.Message:
    msg.task_id = task.id
    return msg


def test_agent_asks_back_and_the_answer_finishes_the_task(
    web_server: WebServer, celery_worker: CeleryWorker, cast: Cast
) -> None:
    """The `asker` playbook asks the caller a question before it answers; a blocking send returns at
    input-required, and the client's answer (a SendMessage with the taskId) completes the task."""
    load_profiles(entries=[{"name": "asker", "role": "Asker", "model": "scripted:asker",
                            "tools": ["ask_agent", "reply", "finish"], "resumable": True}])  # fmt: skip
    alice = cast.saga.owner
    asker, _ = actions.add_agent(
        saga=cast.saga, name="asker", role="Asker", task="Ask first", runtime="internal", profile="asker", by=alice
    )
    actions.set_exposed(saga=cast.saga, handle="agent:asker", exposed=True, by=alice)
    wait_until(lambda: Run.objects.get(collaborator=asker).status in (Run.Status.IDLE, Run.Status.COMPLETED),
               timeout=60, what="the asker's first turn")  # fmt: skip
    url = cast.agent_url(web_server.url, "asker")

    async def converse(client: Client) -> tuple[pb.Task, pb.Task, pb.ListTasksResponse, pb.Task, pb.Task]:
        asked = await send(client, message("summarise the report", message_id="q-1", context_id="ctx-a"))
        got = await client.get_task(pb.GetTaskRequest(id=asked.id))
        listed = await client.list_tasks(pb.ListTasksRequest(context_id="ctx-a"))
        answer = in_task(message("for the board meeting", message_id="a-1"), asked)
        done = await send(client, answer)
        again = await send(client, answer)  # a resend of the answer: the same task, nothing twice
        return asked, got, listed, done, again

    asked, got, listed, done, again = run(url, cast.ext_token, converse)
    assert asked.status.state == got.status.state == pb.TASK_STATE_INPUT_REQUIRED
    assert text_of(asked.status.message) == QUESTION and asked.status.message.role == pb.ROLE_AGENT
    assert [t.status.state for t in listed.tasks] == [pb.TASK_STATE_INPUT_REQUIRED]
    assert done.id == again.id == asked.id and done.context_id == "ctx-a"
    assert done.status.state == again.status.state == pb.TASK_STATE_COMPLETED
    reply = MessageToDict(done.artifacts[0].parts[0])["data"]
    assert reply["asked"] == QUESTION and reply["answer"]["parts"] == [{"text": "for the board meeting"}]
    # Through the kernel: the question was the agent's request to the caller, which the caller answered.
    question = AgentRequest.objects.get(sender=asker, recipient__name="ext")
    assert question.status == AgentRequest.Status.COMPLETED and question.payload["task_id"] == asked.id
    assert question.reply is not None and question.reply["message_id"] == "a-1"
    assert AgentRequest.objects.get(pk=asked.id).status == AgentRequest.Status.COMPLETED

    async def late(client: Client) -> None:  # a terminal task takes no further message
        await send(client, in_task(message("one more thing"), asked))

    with pytest.raises(UnsupportedOperationError):
        run(url, cast.ext_token, late)

    # Cancelled while the agent waits for an answer: its question is declined, not left open.
    async def cancel_when_asked(client: Client) -> tuple[pb.Task, pb.Task]:
        waiting = await send(client, message("never mind", message_id="q-2"))
        return waiting, await client.cancel_task(pb.CancelTaskRequest(id=waiting.id))

    waiting, cancelled = run(url, cast.ext_token, cancel_when_asked)
    assert waiting.status.state == pb.TASK_STATE_INPUT_REQUIRED
    assert cancelled.status.state == pb.TASK_STATE_CANCELED
    declined = AgentRequest.objects.get(sender=asker, payload__task_id=waiting.id)
    assert declined.status == AgentRequest.Status.FAILED and declined.error == {
        "code": "task_cancelled", "message": "The client cancelled the task this question is about."}  # fmt: skip


def ask_back(slow: Collaborator, task_id: str, question: str) -> None:
    """`slow` (an external agent, driven by the test through the kernel) asks the caller back."""
    try:
        actions.ask_agent(
            sender=slow, to="agent:ext", type="question", payload={"task_id": task_id, "question": question}
        )
    finally:
        connection.close()


def test_follow_up_question_and_stream_to_input_required(web_server: WebServer, cast: Cast) -> None:
    """No worker: `slow` is an external agent whose steering and requests the test reads and writes."""
    url = cast.agent_url(web_server.url, "slow")

    async def start_and_follow_up(client: Client) -> tuple[pb.Task, pb.Task]:
        task = await send(client, message("draft it", context_id="ctx-s"), return_immediately=True)
        follow_up = in_task(message("and keep it short", message_id="f-1"), task)
        await send(client, follow_up, return_immediately=True)
        after = await send(client, follow_up, return_immediately=True)  # resent: delivered once
        return task, after

    task, after = run(url, cast.ext_token, start_and_follow_up)
    assert task.status.state == after.status.state == pb.TASK_STATE_SUBMITTED and after.id == task.id
    items = SteeringItem.objects.filter(recipient=cast.slow, kind=SteeringItem.Kind.MESSAGE)
    assert [(i.sender, i.payload) for i in items] == [
        ("agent:ext", {"request_id": task.id, "key": "a2a:f-1", "message": {
            "parts": [{"text": "and keep it short"}], "message_id": "f-1", "context_id": "ctx-s"}})
    ]  # fmt: skip

    # A stream follows the task until the agent asks back, an interrupted state: there it closes.
    async def stream_until_asked(client: Client) -> list[pb.StreamResponse]:
        events = []
        stream = client.subscribe(pb.SubscribeToTaskRequest(id=task.id))
        assert isinstance(stream, AsyncGenerator)
        async for event in stream:
            events.append(event)
            if len(events) == 1:
                await asyncio.to_thread(ask_back, cast.slow, task.id, "Short as in one page?")
        return events

    events = run(url, cast.ext_token, stream_until_asked, streaming=True)
    assert events[0].task.status.state == pb.TASK_STATE_SUBMITTED
    last = events[-1].status_update.status
    assert last.state == pb.TASK_STATE_INPUT_REQUIRED and text_of(last.message) == "Short as in one page?"

    # The follow-up resent now (its answer lost on the way) is not the answer to the question asked since.
    async def resend_follow_up(client: Client) -> pb.Task:
        return await send(
            client, in_task(message("and keep it short", message_id="f-1"), task), return_immediately=True
        )

    assert run(url, cast.ext_token, resend_follow_up).status.state == pb.TASK_STATE_INPUT_REQUIRED
    assert AgentRequest.objects.get(sender=cast.slow, recipient__name="ext").status == AgentRequest.Status.PENDING

    # The answer goes to the question, not to the agent's steering as a follow-up.
    async def answer(client: Client) -> pb.Task:
        return await send(client, in_task(message("yes, one page", message_id="a-2"), task), return_immediately=True)

    answered = run(url, cast.ext_token, answer)
    question = AgentRequest.objects.get(sender=cast.slow, recipient__name="ext")
    assert question.status == AgentRequest.Status.COMPLETED
    assert question.reply is not None and question.reply["parts"] == [{"text": "yes, one page"}]
    assert answered.status.state == pb.TASK_STATE_SUBMITTED
    assert SteeringItem.objects.filter(recipient=cast.slow, kind=SteeringItem.Kind.MESSAGE).count() == 1

    # A blocking answer to a second question waits for the task to finish.
    ask_back(cast.slow, task.id, "Anything else?")

    def reply_when_answered() -> None:
        try:
            wait_until(
                lambda: (
                    AgentRequest.objects.filter(sender=cast.slow, status=AgentRequest.Status.COMPLETED).count() == 2
                ),
                timeout=60,
                what="the second answer",
            )
            actions.reply_to_request(request_id=task.id, by=cast.slow.user, payload="One page, done.")
        finally:
            connection.close()

    replier = threading.Thread(target=reply_when_answered)
    replier.start()

    async def blocking_answer(client: Client) -> pb.Task:
        return await send(client, in_task(message("no"), task))

    try:
        done = run(url, cast.ext_token, blocking_answer)
    finally:
        replier.join(timeout=60)
    assert done.status.state == pb.TASK_STATE_COMPLETED
    assert MessageToDict(done.artifacts[0].parts[0]) == {"text": "One page, done."}
    # The task's history is the whole conversation: follow-up, questions and answers, the reply.
    user, agent = pb.ROLE_USER, pb.ROLE_AGENT
    assert [(m.role, text_of(m)) for m in done.history] == [
        (user, "draft it"), (user, "and keep it short"), (agent, "Short as in one page?"), (user, "yes, one page"),
        (agent, "Anything else?"), (user, "no"), (agent, "One page, done."),
    ]  # fmt: skip
    assert [m.message_id for m in done.history][1:4] == ["f-1", question.pk, "a-2"]


def rpc(server: WebServer, cast: Cast, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    headers = {"Authorization": f"Bearer {cast.ext_token}", "A2A-Version": "1.0"}
    response = httpx.post(cast.agent_url(server.url, "slow"), json=body, headers=headers, timeout=30)
    return dict(response.json())


def test_blocking_sends_and_streams_count_against_the_wait_cap(redis_url: str, artifacts: Path, cast: Cast) -> None:
    """One wait per agent: while a stream is open, a blocking send and another stream are refused
    with the spec's system error (-32603, code too_many_waits) and write nothing; a send that
    returns at once still goes through; the slot is free again when the stream ends."""
    server = WebServer(redis_url, artifacts, env={"AGORA_MAX_WAITS_PER_AGENT": "1", "AGORA_DEFAULT_WAIT_S": "0.5"})
    slots = redis.Redis.from_url(redis_url)
    try:
        url = cast.agent_url(server.url, "slow")
        holding, done = threading.Event(), threading.Event()

        async def hold_a_stream(client: Client) -> None:
            stream = client.send_message(pb.SendMessageRequest(message=message("stream me")))
            assert isinstance(stream, AsyncGenerator)
            await first(stream)
            holding.set()
            await asyncio.to_thread(done.wait, 60)
            await stream.aclose()

        holder = threading.Thread(target=lambda: run(url, cast.ext_token, hold_a_stream, streaming=True))
        holder.start()
        try:
            assert holding.wait(60)
            msg = {"messageId": "over-cap", "role": "ROLE_USER", "parts": [{"text": "wait for me"}]}
            refused = rpc(server, cast, {"message": msg})

            async def another_stream(client: Client) -> None:
                await first(client.send_message(pb.SendMessageRequest(message=message(message_id="over-cap-2"))))

            with pytest.raises(InternalError):
                run(url, cast.ext_token, another_stream, streaming=True)
            returned = rpc(server, cast, {"message": {**msg, "messageId": "at-once"},
                                          "configuration": {"returnImmediately": True}})  # fmt: skip
        finally:
            done.set()
            holder.join(timeout=60)
        assert refused["error"]["code"] == -32603 and "too_many_waits" in str(refused["error"]), refused
        assert returned["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
        assert not AgentRequest.objects.filter(payload__message_id__startswith="over-cap").exists()
        ext = Collaborator.objects.get(saga=cast.saga, name="ext")
        wait_until(lambda: slots.zcard(f"agora:waits:agent:{ext.pk}") == 0, timeout=30, what="the stream's slot")
        # A streaming method's error comes as the one event of a stream, as the spec's streams do.
        unknown = httpx.post(
            cast.agent_url(server.url, "slow"),
            json={"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": "req-nothing"}},
            headers={"Authorization": f"Bearer {cast.ext_token}", "A2A-Version": "1.0"},
        )
        assert unknown.headers["content-type"].startswith("text/event-stream")
        assert unknown.text.startswith("data: ") and '"code":-32001' in unknown.text.replace(" ", "")
        # Free again: a blocking send waits (its deadline is half a second here) and returns the open task.
        again = rpc(server, cast, {"message": {**msg, "messageId": "after"}})
        assert again["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED", again
    finally:
        slots.close()
        server.stop()
