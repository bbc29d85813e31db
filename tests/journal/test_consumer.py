"""The journal WebSocket, `/ws/sagas/<id>/journal/?after=N`, through the real Redis channel layer.

It authenticates (session or token), checks that the caller may view the saga, replays the events
after N from the database, then streams live ones: every event once, in seq order.
"""

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from accounts.actions import issue_token
from accounts.models import User
from config.asgi import application
from journal.actions import record
from sagas.models import Saga
from tests.support import BASE_DIR, child_env

pytestmark = pytest.mark.django_db(transaction=True)

Headers = list[tuple[bytes, bytes]]
ORIGIN = (b"origin", b"http://localhost")
TIMEOUT = 10.0


def session_headers(user: User) -> Headers:
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [ORIGIN, (b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode())]


def token_headers(user: User) -> Headers:
    return [ORIGIN, (b"authorization", f"Token {issue_token(user=user)}".encode())]


@pytest.fixture
def as_alice(alice: User) -> Headers:
    return session_headers(alice)


@pytest.fixture
def saga_with_notes(saga: Saga, base_seq: int) -> Saga:
    """The saga's creation events, then three notes."""
    for i in range(3):
        record(saga_id=saga.pk, type="note", data={"i": i})
    return saga


@pytest.fixture
def last_seq(saga_with_notes: Saga, base_seq: int) -> int:
    return base_seq + 3


@asynccontextmanager
async def journal_socket(
    saga_id: object, headers: Headers, after: int | str = 0
) -> AsyncIterator[WebsocketCommunicator]:
    socket = WebsocketCommunicator(application, f"/ws/sagas/{saga_id}/journal/?after={after}", headers=headers)
    connected, code = await socket.connect(timeout=TIMEOUT)
    try:
        assert connected, f"refused with close code {code}"
        yield socket
    finally:
        await socket.disconnect()


async def refusal(saga_id: object, headers: Headers, after: int | str = 0) -> tuple[bool, Any]:
    return await connected_to(
        WebsocketCommunicator(application, f"/ws/sagas/{saga_id}/journal/?after={after}", headers=headers)
    )


async def connected_to(socket: WebsocketCommunicator) -> tuple[bool, Any]:
    try:
        result: tuple[bool, Any] = await socket.connect(timeout=TIMEOUT)
        return result
    finally:
        await socket.disconnect()


async def next_seqs(socket: WebsocketCommunicator, count: int) -> list[int]:
    seqs = []
    for _ in range(count):
        message = await socket.receive_json_from(timeout=TIMEOUT)
        assert message["type"] == "event"
        seqs.append(message["event"]["seq"])
    return seqs


record_async: Callable[..., Any] = database_sync_to_async(record)


async def test_replays_after_the_cursor_then_streams_live_events(
    saga_with_notes: Saga, last_seq: int, as_alice: Headers
) -> None:
    saga = saga_with_notes
    async with journal_socket(saga.pk, as_alice, after=last_seq - 2) as socket:
        replayed = [await socket.receive_json_from(timeout=TIMEOUT) for _ in range(2)]
        assert [m["event"]["seq"] for m in replayed] == [last_seq - 1, last_seq]
        assert [m["event"]["data"] for m in replayed] == [{"i": 1}, {"i": 2}]

        # Recorded and committed in another thread after the socket connected: it can only reach
        # the socket through the channel layer.
        live = await record_async(saga_id=saga.pk, type="live", actor="agent:coder", data={"k": "v"})
        message = await socket.receive_json_from(timeout=TIMEOUT)
        assert message == {"type": "event", "event": live.as_dict()}

        await record_async(saga_id=saga.pk, type="live")
        assert await next_seqs(socket, 1) == [last_seq + 2]  # not the previous one again: no duplicate


async def test_token_authentication_streams_the_journal(alice: User, saga_with_notes: Saga, last_seq: int) -> None:
    saga = saga_with_notes
    headers = await database_sync_to_async(token_headers)(alice)
    async with journal_socket(saga.pk, headers) as socket:
        assert await next_seqs(socket, last_seq) == list(range(1, last_seq + 1))
        await record_async(saga_id=saga.pk, type="live")
        assert await next_seqs(socket, 1) == [last_seq + 1]


async def test_events_recorded_during_the_replay_arrive_once_and_in_order(
    saga_with_notes: Saga, last_seq: int, as_alice: Headers
) -> None:
    saga = saga_with_notes
    extra = 30

    async def write_while_connecting() -> None:
        for i in range(extra):
            await record_async(saga_id=saga.pk, type="racing", data={"i": i})

    socket = WebsocketCommunicator(application, f"/ws/sagas/{saga.pk}/journal/?after=0", headers=as_alice)
    try:
        (connected, _), _ = await asyncio.gather(socket.connect(timeout=TIMEOUT), write_while_connecting())
        assert connected
        total = last_seq + extra
        assert await next_seqs(socket, total) == list(range(1, total + 1))
        await record_async(saga_id=saga.pk, type="sentinel")
        assert await next_seqs(socket, 1) == [total + 1]
    finally:
        await socket.disconnect()


def record_without_publishing(saga: Saga) -> str:
    """Record from another process whose Redis is unreachable, so its publish is lost, as on a Redis blip."""
    script = (
        "import sys, django; django.setup(); from journal.actions import record; "
        "record(saga_id=sys.argv[1], type='unannounced')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(saga.pk)],
        cwd=BASE_DIR,
        env=child_env("redis://127.0.0.1:1/0"),  # nothing listens on port 1
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stderr


async def test_a_missed_live_event_is_read_back_from_the_database(
    saga_with_notes: Saga, last_seq: int, as_alice: Headers
) -> None:
    saga = saga_with_notes
    async with journal_socket(saga.pk, as_alice, after=last_seq) as socket:
        log = await database_sync_to_async(record_without_publishing)(saga)
        assert f"journal publish for saga {saga.pk} seq {last_seq + 1} failed" in log

        await record_async(saga_id=saga.pk, type="announced")

        first, second = [await socket.receive_json_from(timeout=TIMEOUT) for _ in range(2)]
        assert (first["event"]["seq"], first["event"]["type"]) == (last_seq + 1, "unannounced")
        assert (second["event"]["seq"], second["event"]["type"]) == (last_seq + 2, "announced")


async def test_anonymous_and_outsiders_are_refused(saga: Saga, mallory: User) -> None:
    as_mallory = await database_sync_to_async(session_headers)(mallory)
    mallory_token = await database_sync_to_async(token_headers)(mallory)

    assert await refusal(saga.pk, [ORIGIN]) == (False, 4404)
    assert await refusal(saga.pk, as_mallory) == (False, 4404)
    assert await refusal(saga.pk, mallory_token) == (False, 4404)
    assert await refusal(saga.pk, [ORIGIN, (b"authorization", b"Token usr_not-a-real-token")]) == (False, 4404)


async def test_an_unknown_saga_looks_like_a_forbidden_one(as_alice: Headers) -> None:
    assert await refusal("00000000-0000-4000-8000-000000000000", as_alice) == (False, 4404)


@pytest.mark.parametrize("path", ["/ws/sagas/not-a-uuid/journal/", "/ws/sagas/", "/ws/"])
async def test_a_path_that_names_no_sagas_journal_is_refused_as_an_unknown_saga(as_alice: Headers, path: str) -> None:
    """The router found no route and raised: a traceback, and a handshake dropped by a server error."""
    assert await connected_to(WebsocketCommunicator(application, path, headers=as_alice)) == (False, 4404)


async def test_a_foreign_origin_is_refused(saga: Saga, alice: User) -> None:
    headers = await database_sync_to_async(session_headers)(alice)
    foreign = [(b"origin", b"http://evil.example"), *headers[1:]]

    connected, _ = await refusal(saga.pk, foreign)

    assert not connected


async def test_a_bad_cursor_is_refused(saga: Saga, as_alice: Headers) -> None:
    assert await refusal(saga.pk, as_alice, after="abc") == (False, 4400)
    assert await refusal(saga.pk, as_alice, after="%C2%B2") == (False, 4400)  # "²": a digit, not ASCII
    raw = WebsocketCommunicator(application, f"/ws/sagas/{saga.pk}/journal/", headers=as_alice)
    raw.scope["query_string"] = b"after=\xff"  # as a server hands over a client's bytes: not UTF-8
    assert await connected_to(raw) == (False, 4400)


async def test_messages_a_client_sends_are_checked_and_never_drop_the_socket(
    saga_with_notes: Saga, last_seq: int, as_alice: Headers
) -> None:
    saga = saga_with_notes
    async with journal_socket(saga.pk, as_alice, after=last_seq) as socket:
        for text in ["[" * 5000 + "]" * 5000, '{"x": "\\ud800"}', '"\\u0000"', "not json"]:
            await socket.send_to(text_data=text)
            reply = await socket.receive_json_from(timeout=TIMEOUT)
            assert reply["type"] == "error" and reply["code"] == "invalid_payload", reply
        await socket.send_to(bytes_data=b"\x00\x01")
        assert (await socket.receive_json_from(timeout=TIMEOUT))["code"] == "invalid_payload"
        await socket.send_to(text_data='{"hello": "ignored"}')  # acceptable, and ignored: the journal is read-only
        await record_async(saga_id=saga.pk, type="live")
        assert await next_seqs(socket, 1) == [last_seq + 1]  # still streaming
