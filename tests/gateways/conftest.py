"""The A2A gateway's cast: in alice's saga, `ext` is the external agent that calls through the
gateway, `responder` an internal scripted agent and `slow` an external agent that answers only when
a test says so; both are exposed. `quiet` is an agent nobody exposed."""

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb

from accounts.models import User
from agents.actions import load_profiles
from sagas import actions
from sagas.models import Collaborator, Saga

T = TypeVar("T")


@dataclass
class Cast:
    saga: Saga
    ext_token: str
    slow: Collaborator
    responder: Collaborator

    def agent_url(self, base_url: str, name: str) -> str:
        return f"{base_url}/a2a/{self.saga.pk}/{name}/"


@pytest.fixture
def cast(transactional_db: None, alice: User) -> Cast:
    load_profiles(entries=[{"name": "responder", "role": "Responder", "model": "scripted:responder",
                            "tools": ["reply", "finish"], "resumable": True}])  # fmt: skip
    saga = actions.create_saga(title="Gateway", goal="Meet agents of other frameworks", owner=alice)
    _, token = actions.add_agent(saga=saga, name="ext", role="Client", task="Ask", runtime="external", by=alice)
    slow, _ = actions.add_agent(saga=saga, name="slow", role="Thinker", task="Think", runtime="external", by=alice)
    responder, _ = actions.add_agent(
        saga=saga, name="responder", role="Responder", task="Answer", runtime="internal", profile="responder", by=alice
    )
    actions.add_agent(saga=saga, name="quiet", role="Hidden", task="Stay hidden", runtime="external", by=alice)
    for name in ("slow", "responder"):
        actions.set_exposed(saga=saga, handle=f"agent:{name}", exposed=True, by=alice)
    assert token is not None
    return Cast(saga=saga, ext_token=token, slow=slow, responder=responder)


def message(text: str = "hello", *, data: Any = None, message_id: str = "", context_id: str = "") -> pb.Message:
    parts = [pb.Part(text=text)]
    if data is not None:
        part = pb.Part()
        part.data.struct_value.update(data)
        parts.append(part)
    return pb.Message(message_id=message_id or uuid.uuid4().hex, context_id=context_id, role=pb.ROLE_USER, parts=parts)


async def with_client(
    url: str, token: str | None, use: Callable[[Client], Awaitable[T]], *, streaming: bool = False
) -> T:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        client = await create_client(url, ClientConfig(httpx_client=http, streaming=streaming))
        try:
            return await use(client)
        finally:
            await client.close()


def run(url: str, token: str | None, use: Callable[[Client], Awaitable[T]], *, streaming: bool = False) -> T:
    return asyncio.run(with_client(url, token, use, streaming=streaming))


async def first(stream: AsyncIterator[T]) -> T:
    async for item in stream:
        return item
    raise AssertionError("the stream ended without an item")


async def send(client: Client, msg: pb.Message, *, return_immediately: bool = False) -> pb.Task:
    request = pb.SendMessageRequest(message=msg)
    request.configuration.return_immediately = return_immediately
    response = await first(client.send_message(request))
    assert response.HasField("task"), response
    return response.task
