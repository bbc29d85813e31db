"""Rate limits shared by every web process: sign-in attempts per account and per client address,
and requests per agent.

The counters are django-ratelimit's: a fixed window per key, counted with an atomic `add`/`incr`
in the default cache, which is Redis (config/settings.py), so N web processes give the same budget
as one. The API applies them as DRF throttles (429 `throttled` with `Retry-After`); the sign-in
form through `signin_refused`.
"""

import unicodedata
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django_ratelimit.core import get_usage
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle


def client_address(request: HttpRequest | Request) -> str:
    """The client's address: the peer's, or with `AGORA_TRUSTED_PROXIES` = n proxies in front, the
    address the n-th of them saw (the n-th entry of X-Forwarded-For from the right). Entries further
    left were written by the client itself and are never used, so a made-up X-Forwarded-For does
    not move a client to a fresh counter."""
    meta = request.META
    proxies = settings.AGORA_TRUSTED_PROXIES
    if proxies > 0:
        forwarded = [a.strip() for a in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if a.strip()]
        if len(forwarded) >= proxies:
            return forwarded[-proxies]
    return str(meta.get("REMOTE_ADDR", ""))


def _usage(request: HttpRequest, group: str, value: str, rate: str) -> dict[str, Any] | None:
    """Count one more hit of value in group; the usage, with `should_limit` once over the rate."""
    return get_usage(request, group=group, key=lambda _group, _request: value, rate=rate, increment=True)


def signin_refused(request: HttpRequest, username: Any) -> int | None:
    """Count a sign-in attempt against its client address and its account; the seconds to wait when
    either is over its rate, else None. Every attempt counts: a guesser cannot tell a refused
    attempt from a counted one, and a person does not sign in dozens of times a minute."""
    waits = []
    for group, value, rate in (
        ("signin.address", client_address(request), settings.AGORA_SIGNIN_RATE_PER_ADDRESS),
        ("signin.account", account_of(username), settings.AGORA_SIGNIN_RATE_PER_ACCOUNT),
    ):
        usage = _usage(request, group, value, rate)
        if usage is not None and usage["should_limit"]:
            waits.append(max(1, int(usage["time_left"])))
    return max(waits) if waits else None


def account_of(username: Any) -> str:
    """The account an attempt is for, as signing in reads its name, so that no other spelling of
    it is a fresh counter: a number is its text (the token endpoint's CharField takes one), and
    compatibility forms are one name (the form's UsernameField reads NFKC: alice in full-width letters is alice)."""
    if isinstance(username, bool) or not isinstance(username, str | int | float):
        return ""
    return unicodedata.normalize("NFKC", str(username)).strip().casefold()


class SignInThrottle(BaseThrottle):
    """Token requests (`POST /api/v1/auth/token/`), per client address and per account."""

    def __init__(self) -> None:
        self.retry_after: int | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        username = request.data.get("username", "") if isinstance(request.data, dict) else ""
        self.retry_after = signin_refused(request._request, username)
        return self.retry_after is None

    def wait(self) -> float | None:
        return self.retry_after


class AgentQuota(BaseThrottle):
    """Requests per second per agent (`AGORA_AGENT_RATE`), over every API call an agent makes.
    People are not limited here: their sign-in is."""

    def __init__(self) -> None:
        self.retry_after: int | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        user = request.user
        if not getattr(user, "is_agent", False):
            return True
        usage = _usage(request._request, "api.agent", str(user.pk), settings.AGORA_AGENT_RATE)
        if usage is None or not usage["should_limit"]:
            return True
        self.retry_after = max(1, int(usage["time_left"]))
        return False

    def wait(self) -> float | None:
        return self.retry_after
