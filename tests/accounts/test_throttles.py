"""Brute force: sign-in attempts are counted per client address and per account in Redis, shared by
every web process, and a client cannot reset its count with a made-up X-Forwarded-For; agents have
a request quota, counted atomically."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.http import HttpResponse
from django.test import Client
from redis import Redis

from accounts.actions import issue_token
from accounts.models import User
from sagas import actions
from tests.sagas.api_http import Http, client_for, problem
from tests.support import WebServer

TOKEN = "/api/v1/auth/token/"
LOGIN = "/accounts/login/"


@pytest.fixture
def tight(settings: LazySettings) -> None:
    """Small budgets over a day-long window, so that no window rolls over during a test."""
    settings.AGORA_SIGNIN_RATE_PER_ADDRESS = "3/d"
    settings.AGORA_SIGNIN_RATE_PER_ACCOUNT = "5/d"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *settings.PASSWORD_HASHERS]


def token_attempt(client: Client, username: str, password: str, forwarded_for: str = "") -> HttpResponse:
    extra = {"HTTP_X_FORWARDED_FOR": forwarded_for} if forwarded_for else {}
    body = {"username": username, "password": password}
    response: HttpResponse = client.post(TOKEN, body, content_type="application/json", **extra)  # type: ignore[arg-type,assignment]
    return response


@pytest.mark.usefixtures("tight")
def test_token_requests_are_throttled_per_address_whatever_x_forwarded_for_says(alice: User) -> None:
    client = Client()
    for i in range(3):
        response = token_attempt(client, "alice", "wrong", f"10.0.0.{i}")
        problem(response, 400, "invalid_credentials")
    refused = token_attempt(client, "alice", "alice-password", "10.9.9.9")
    problem(refused, 429, "throttled")
    assert 0 < int(refused["Retry-After"]) <= 86400
    # Another address still signs in: the limit is per client, not global.
    assert token_attempt(Client(REMOTE_ADDR="192.0.2.7"), "alice", "alice-password").status_code == 200


@pytest.mark.usefixtures("tight")
def test_token_requests_are_throttled_per_account_across_addresses(alice: User, bob: User) -> None:
    for i in range(5):
        problem(token_attempt(Client(REMOTE_ADDR=f"192.0.2.{i}"), "alice", "wrong"), 400, "invalid_credentials")
    problem(token_attempt(Client(REMOTE_ADDR="192.0.2.99"), "alice", "alice-password"), 429, "throttled")
    problem(token_attempt(Client(REMOTE_ADDR="192.0.2.99"), " ALICE", "x"), 429, "throttled")  # same account
    assert token_attempt(Client(REMOTE_ADDR="192.0.2.99"), "bob", "bob-password").status_code == 200


@pytest.mark.usefixtures("tight")
def test_behind_trusted_proxies_the_address_is_what_the_proxy_saw(alice: User, settings: LazySettings) -> None:
    settings.AGORA_TRUSTED_PROXIES = 1
    proxy = Client(REMOTE_ADDR="10.0.0.1")
    for prefix in ("1.1.1.1", "2.2.2.2", "3.3.3.3"):  # the client writes the left part; the proxy appends
        token_attempt(proxy, "alice", "wrong", f"{prefix}, 198.51.100.5")
    problem(token_attempt(proxy, "alice", "wrong", "4.4.4.4, 198.51.100.5"), 429, "throttled")
    other = token_attempt(proxy, "alice", "alice-password", "198.51.100.6")
    assert other.status_code == 200


@pytest.mark.usefixtures("tight")
def test_the_sign_in_form_is_throttled_and_refuses_even_the_right_password(alice: User) -> None:
    browser = Client()
    for i in range(3):
        failed = browser.post(LOGIN, {"username": "alice", "password": "wrong"}, HTTP_X_FORWARDED_FOR=f"10.0.0.{i}")
        assert failed.status_code == 200 and b"do not match" in failed.content
    refused = browser.post(LOGIN, {"username": "alice", "password": "alice-password"}, HTTP_X_FORWARDED_FOR="10.1.1.1")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert b"Too many sign-in attempts" in refused.content
    assert "_auth_user_id" not in browser.session
    signed_in = Client(REMOTE_ADDR="192.0.2.50").post(LOGIN, {"username": "alice", "password": "alice-password"})
    assert signed_in.status_code == 302


def test_web_processes_share_their_counters_and_agents_quotas_are_atomic(
    transactional_db: None, alice: User, redis_url: str, settings: LazySettings, artifacts: Path
) -> None:
    """One daphne process next to this one: sign-in attempts count the same wherever they land, and
    concurrent calls of one agent get exactly its quota through."""
    rates = {
        "AGORA_SIGNIN_RATE_PER_ADDRESS": "4/d",
        "AGORA_SIGNIN_RATE_PER_ACCOUNT": "100/d",
        "AGORA_AGENT_RATE": "10/d",
    }
    for name, value in rates.items():
        setattr(settings, name, value)
    saga = actions.create_saga(title="Quota", goal="g", owner=alice)
    agent, _ = actions.add_agent(saga=saga, name="busy", role="Busy", task="t", runtime="external", by=alice)
    server = WebServer(redis_url, artifacts, env=rates)
    try:
        here, there = Client(REMOTE_ADDR="127.0.0.1"), Http(server.url)
        body = {"username": "alice", "password": "wrong"}
        problem(token_attempt(here, "alice", "wrong"), 400, "invalid_credentials")
        there.post(TOKEN, body).problem(400, "invalid_credentials")
        problem(token_attempt(here, "alice", "wrong"), 400, "invalid_credentials")
        there.post(TOKEN, body).problem(400, "invalid_credentials")
        # The fifth attempt from 127.0.0.1, whichever process takes it.
        there.post(TOKEN, body).problem(429, "throttled")
        problem(token_attempt(here, "alice", "wrong"), 429, "throttled")
        assert Redis.from_url(redis_url).keys("agora:*")  # the counters live in Redis, not in a process

        api = Http(server.url, issue_token(user=agent.user))
        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = sorted(pool.map(lambda _: api.get("/api/v1/sagas/").status, range(20)))
        assert statuses == [200] * 10 + [429] * 10
        refused = api.get("/api/v1/sagas/")
        refused.problem(429, "throttled")
        assert int(refused.headers["retry-after"]) > 0
    finally:
        server.stop()


def test_people_are_not_under_the_agent_quota(alice: User, settings: LazySettings) -> None:
    settings.AGORA_AGENT_RATE = "1/d"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    api = client_for(alice)
    assert [api.get("/api/v1/sagas/").status_code for _ in range(3)] == [200, 200, 200]


@pytest.mark.usefixtures("tight")
def test_another_spelling_of_an_account_is_the_same_account(alice: User) -> None:
    """Signing in reads a name as its NFKC form (the form) or a number as its text (the token
    endpoint): each other spelling counted apart gave a guesser a fresh budget for one account."""
    User.objects.create_user(username="12345", password="number-password")
    for account in ("alice", "12345"):
        for i in range(5):  # the account's budget, from addresses within theirs
            token_attempt(Client(REMOTE_ADDR=f"192.0.2.{i}"), account, "wrong")

    fullwidth = "".join(chr(ord(c) + 0xFEE0) for c in "alice")  # full-width letters: it signs in as alice
    form = Client(REMOTE_ADDR="192.0.2.50").post(LOGIN, {"username": fullwidth, "password": "alice-password"})
    number = Client(REMOTE_ADDR="192.0.2.51").post(TOKEN, {"username": 12345, "password": "number-password"},
                                                   content_type="application/json")  # fmt: skip

    assert (form.status_code, number.status_code) == (429, 429)
