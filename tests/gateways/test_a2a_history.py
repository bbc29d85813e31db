"""A task's history through the gateway, with the SDK's client against daphne, a Celery worker and
Redis: the `chat` playbook asks again after each of the client's messages until it is told "done",
so one task is a conversation of several messages, read back in order and cut by historyLength;
and ListTasks filters on input-required, a state derived from the agent's open question."""

import pytest
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb

from agents.actions import load_profiles
from sagas import actions
from sagas.models import Run
from tests.gateways.conftest import Cast, message, run, send
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.integration

QUESTION = "Anything else?"


def said(msg: pb.Message) -> tuple[int, str]:
    return msg.role, " ".join(part.text for part in msg.parts if part.HasField("text"))


def test_history_holds_the_conversation_in_order(
    web_server: WebServer, celery_worker: CeleryWorker, cast: Cast
) -> None:
    load_profiles(entries=[{"name": "chat", "role": "Chat", "model": "scripted:chat",
                            "tools": ["ask_agent", "reply", "finish"], "resumable": True}])  # fmt: skip
    alice = cast.saga.owner
    chat, _ = actions.add_agent(
        saga=cast.saga, name="chat", role="Chat", task="Talk", runtime="internal", profile="chat", by=alice
    )
    actions.set_exposed(saga=cast.saga, handle="agent:chat", exposed=True, by=alice)
    wait_until(lambda: Run.objects.get(collaborator=chat).status in (Run.Status.IDLE, Run.Status.COMPLETED),
               timeout=60, what="the chat agent's first turn")  # fmt: skip
    url = cast.agent_url(web_server.url, "chat")

    async def converse(client: Client) -> dict[str, object]:
        first = await send(client, message("hello", message_id="m-1", context_id="ctx-h"))
        states = [first.status.state]
        for i, text in enumerate(["the first detail", "the second detail", "done"], start=2):
            further = message(text, message_id=f"m-{i}")
            further.task_id = first.id
            states.append((await send(client, further)).status.state)
        other = await send(client, message("another topic", message_id="o-1"))
        full = await client.get_task(pb.GetTaskRequest(id=first.id))
        two = await client.get_task(pb.GetTaskRequest(id=first.id, history_length=2))
        none = await client.get_task(pb.GetTaskRequest(id=first.id, history_length=0))
        asking = await client.list_tasks(pb.ListTasksRequest(status=pb.TASK_STATE_INPUT_REQUIRED))
        working = await client.list_tasks(pb.ListTasksRequest(status=pb.TASK_STATE_WORKING))
        completed = await client.list_tasks(pb.ListTasksRequest(status=pb.TASK_STATE_COMPLETED, history_length=1))
        return {"states": states, "first": first, "other": other, "full": full, "two": two, "none": none,
                "asking": asking, "working": working, "completed": completed}  # fmt: skip

    got = run(url, cast.ext_token, converse)
    ask, done = pb.TASK_STATE_INPUT_REQUIRED, pb.TASK_STATE_COMPLETED
    assert got["states"] == [ask, ask, ask, done]
    full = got["full"]
    assert isinstance(full, pb.Task)
    user, agent = pb.ROLE_USER, pb.ROLE_AGENT
    history = [said(m) for m in full.history]
    assert [role for role, _ in history] == [user, agent, user, agent, user, agent, user, agent]
    assert [text for role, text in history if role == user] == [
        "hello", "the first detail", "the second detail", "done"]  # fmt: skip
    assert all(text.startswith("Noted. " + QUESTION) for role, text in history[1:6:2])
    assert [m.message_id for m in full.history if m.role == user] == ["m-1", "m-2", "m-3", "m-4"]
    assert all(m.task_id == full.id and m.context_id == "ctx-h" for m in full.history)
    assert full.history[-1].message_id == f"{full.id}-reply"  # the agent's reply closes it
    two, none = got["two"], got["none"]
    assert isinstance(two, pb.Task) and isinstance(none, pb.Task)
    assert list(two.history) == list(full.history[-2:]) and len(none.history) == 0
    # The filter on input-required: only the task the agent asked about and is still waiting on.
    other = got["other"]
    assert isinstance(other, pb.Task) and other.status.state == ask
    asking, working, completed = got["asking"], got["working"], got["completed"]
    assert isinstance(asking, pb.ListTasksResponse) and isinstance(working, pb.ListTasksResponse)
    assert isinstance(completed, pb.ListTasksResponse)
    assert [t.id for t in asking.tasks] == [other.id] and asking.tasks[0].status.state == ask
    assert [said(m) for m in asking.tasks[0].history] == [(user, "another topic"), (agent, history[1][1])]
    assert list(working.tasks) == []  # an asking task is input-required, not also working
    assert [t.id for t in completed.tasks] == [full.id]
    assert list(completed.tasks[0].history) == list(full.history[-1:])
