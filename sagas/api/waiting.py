"""HTTP waits (`ask_agent` with `mode=wait`, the steering long-poll) as async views around DRF views.

DRF is synchronous, so an API view that may wait does everything that needs the database in its
ordinary sync handler (authenticate, parse, authorize, call the action) and, when the caller should
wait, returns a `WaitingResponse` that says what for. The async wrapper then awaits a Redis wake-up
on the request's or the recipient's channel and re-reads the database on every ring and every
`RECHECK_S` anyway, so a lost publish (or Redis being down) only delays the answer. While it waits
it holds no transaction, no database connection and no busy thread: only the client's socket and a
Redis subscription.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from redis.exceptions import RedisError
from rest_framework.response import Response
from rest_framework.views import APIView

from sagas.waits import WaitSlot

logger = logging.getLogger(__name__)

RECHECK_S = 1.0  # how long a lost wake-up can delay an answer


@dataclass(frozen=True)
class Done:
    """The final answer of a wait: the HTTP status and the body."""

    status: int
    data: Any


# Runs in a thread: Done when the wait is over, else the seconds it may still last.
Check = Callable[[], Done | float]


@dataclass(frozen=True)
class Wait:
    channel: str
    check: Check
    slot: WaitSlot | None = None  # released when the wait ends, however it ends


class WaitingResponse(Response):
    """The response to send if the wait ends with nothing new; `wait` says how to wait for more."""

    def __init__(self, data: Any, *, status: int, wait: Wait) -> None:
        super().__init__(data, status=status)
        self.wait = wait


def release_connections() -> None:
    """Close this thread's database connections, so that a waiting call holds none.

    A connection inside a transaction is left alone: that only happens under the test client,
    whose test case wraps everything in one. (Under ASGI each request's sync code runs in a thread
    of its own, so a connection kept open here would not be reused by anyone anyway.)
    """
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def checked(check: Check) -> Done | float:
    try:
        return check()
    finally:
        release_connections()


class Doorbell:
    """A Redis subscription to one wake-up channel; without Redis it degrades to plain re-checks.

    One connection per waiting call keeps it simple and isolated; Redis handles many thousands.
    """

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.client: aioredis.Redis | None = None
        self.pubsub: Any = None

    async def __aenter__(self) -> "Doorbell":
        try:
            self.client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2)
            self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            await self.pubsub.subscribe(self.channel)
        except (RedisError, OSError) as exc:
            logger.warning("cannot subscribe to %s, polling the database instead: %s", self.channel, exc)
            self.pubsub = None
        return self

    async def ring_or_timeout(self, timeout: float) -> None:
        """Return when the channel rings or after timeout seconds, whichever comes first."""
        if self.pubsub is not None:
            try:
                await self.pubsub.get_message(timeout=timeout)
                return
            except (RedisError, OSError) as exc:
                logger.warning("lost the subscription to %s, polling the database instead: %s", self.channel, exc)
                self.pubsub = None
        await asyncio.sleep(timeout)

    async def __aexit__(self, *exc_info: type[BaseException] | BaseException | TracebackType | None) -> None:
        try:
            if self.pubsub is not None:
                await self.pubsub.aclose()
            if self.client is not None:
                await self.client.aclose()
        except (RedisError, OSError) as exc:
            logger.info("closing the subscription to %s: %s", self.channel, exc)


async def wait_until_done(wait: Wait) -> Done:
    check = sync_to_async(checked)
    # Subscribe first, then read: a change committed between the two still rings or is read.
    async with Doorbell(wait.channel) as bell:
        while True:
            outcome = await check(wait.check)
            if isinstance(outcome, Done):
                return outcome
            await bell.ring_or_timeout(max(0.01, min(RECHECK_S, outcome)))


def waiting_view(api: type[APIView]) -> Callable[..., Coroutine[Any, Any, HttpResponseBase]]:
    """An async Django view running `api` (a DRF view) and then, if it asks to, its wait."""
    sync_view = api.as_view()

    def prepare(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        try:
            return sync_view(request, **kwargs)
        finally:
            release_connections()

    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        response = await sync_to_async(prepare)(request, **kwargs)
        if isinstance(response, WaitingResponse):
            # Not rendered yet: Django renders the response after the view returns.
            try:
                done = await wait_until_done(response.wait)
            finally:  # also when the client hangs up and the server cancels the view
                if response.wait.slot is not None:
                    await sync_to_async(response.wait.slot.release)()
            response.status_code, response.data = done.status, done.data
        return response

    # What DRF's as_view() would have set: drf-spectacular finds the API view through `cls`, and
    # DRF checks CSRF itself for session-authenticated calls.
    view.__dict__.update(cls=api, initkwargs={}, csrf_exempt=True)
    view.__doc__ = api.__doc__
    return view
