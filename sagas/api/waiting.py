"""HTTP waits (`ask_agent` with `mode=wait`, the steering long-poll) as async views around DRF views.

DRF is synchronous, so an API view that may wait does everything that needs the database in its
ordinary sync handler (authenticate, parse, authorize, call the action) and, when the caller should
wait, returns a `WaitingResponse` that says what for. The async wrapper then awaits a Redis wake-up
on the request's or the recipient's channel and re-reads the database on every ring and every
`RECHECK_S` anyway, so a lost publish (or Redis being down) only delays the answer. While it waits
it holds no transaction, no database connection and no busy thread: only the client's socket and a
Redis subscription.
"""

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import ApiToken
from sagas.waits import Doorbell, WaitSlot, release_connections

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


def checked(check: Check) -> Done | float:
    try:
        return check()
    finally:
        release_connections()


async def wait_until_done(wait: Wait) -> Done:
    check = sync_to_async(checked)
    # Subscribe first, then read: a change committed between the two still rings or is read.
    async with Doorbell(wait.channel) as bell:
        while True:
            outcome = await check(wait.check)
            if isinstance(outcome, Done):
                return outcome
            await bell.ring_or_timeout(max(0.01, min(RECHECK_S, outcome)))


REVOKED = Done(
    401,
    {"type": "about:blank", "title": "Authentication failed", "status": 401, "code": "authentication_failed",
     "detail": "The token was revoked while the call waited."},
)  # fmt: skip


def while_token_holds(wait: Wait, token: object) -> Wait:
    """The wait, ended with 401 once the token the caller authenticated with is revoked: each
    re-check (every RECHECK_S at most) looks for the token first."""
    if not isinstance(token, ApiToken):
        return wait  # a session: signing out ends the session, not this call
    token_id, check = token.pk, wait.check

    def holds() -> Done | float:
        return check() if ApiToken.objects.filter(pk=token_id).exists() else REVOKED

    return replace(wait, check=holds)


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
                done = await wait_until_done(while_token_holds(response.wait, getattr(request, "auth", None)))
            finally:  # also when the client hangs up and the server cancels the view
                if response.wait.slot is not None:
                    await sync_to_async(response.wait.slot.release)()
            response.status_code, response.data = done.status, done.data
            if done.status == 401:
                response.content_type = "application/problem+json"
        return response

    # What DRF's as_view() would have set: drf-spectacular finds the API view through `cls`, and
    # DRF checks CSRF itself for session-authenticated calls.
    view.__dict__.update(cls=api, initkwargs={}, csrf_exempt=True)
    view.__doc__ = api.__doc__
    return view
