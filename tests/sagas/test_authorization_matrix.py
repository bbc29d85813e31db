"""Who may do what, for every route of the URL configuration and the WebSocket.

The routes are read from the resolver, so a new endpoint is in this test the moment it is routed:
until it has a row in EXPECTED the test fails and prints the row it observed, for a person to check
and paste. Each row states once what each role gets:

- anonymous: no credentials;
- outsider: a person with no part in the saga (mallory);
- foreign: an agent of another saga (mallory's `spy`);
- unaddressed: an agent of the same saga that may not address the request's recipient (`scout`,
  not in `coder`'s part of the tree), nor is party to the request or the form;
- colleague: a person collaborating on the saga who does not manage it (bob).

The saga is alice's (TREE policy); the request is lead → coder, the form coder → alice, the run
coder's. An outcome is the status code, or `login` for a redirect to a sign-in page. Only the methods
a route offers are probed. The admin is probed at its index and
at each registered model's list, since its own routes are Django's.
"""

from collections.abc import Iterator
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings
from django.contrib import admin
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from accounts.actions import issue_token
from accounts.models import User
from config.asgi import application
from journal.routing import websocket_urlpatterns
from sagas import actions
from tests.sagas.kernel import Team

pytestmark = pytest.mark.usefixtures("fast_passwords")

ROLES = ("anonymous", "outsider", "foreign", "unaddressed", "colleague")
METHODS = ("GET", "POST", "DELETE")

# (route name, method): outcomes in the order of ROLES. Writes are probed with an empty body, so a
# role allowed to reach the operation gets its validation error (400); one that may not, 401, 403 or
# 404 (404 whenever the saga, request or form is not theirs to see). /healthz is 503 with no worker.
# An API view parses its input before the kernel decides (STYLE: parse, fetch, act), so a role that
# sees the saga but may not act gets the 400 of an empty body too: the refusals of a valid body are
# tested beside each operation (exposure, teams). A manager's operation (finishing, steering,
# prompting) refuses everyone else first (403), whatever the body.
EXPECTED: dict[tuple[str, str], str] = {
    ("api-artifact", "GET"): "401 404 404 200 200",
    ("api-artifacts", "GET"): "401 404 404 200 200",
    ("api-artifacts", "POST"): "401 404 404 400 400",
    ("api-collaborator-exposure", "POST"): "401 404 404 400 400",
    ("api-prompt", "GET"): "401 404 404 404 404",
    ("api-prompt-cancel", "POST"): "401 404 404 404 404",
    ("api-prompts", "GET"): "401 404 404 200 200",
    ("api-prompts", "POST"): "401 404 404 403 403",
    ("api-run-status", "GET"): "401 404 404 404 404",
    ("api-team", "GET"): "401 404 404 404 404",
    ("api-team-broadcast", "POST"): "401 404 404 404 404",
    ("api-team-inbox", "GET"): "401 404 404 404 404",
    ("api-team-shutdown", "POST"): "401 404 404 404 404",
    ("api-team-spawn", "POST"): "401 404 404 400 400",
    ("prompt-cancel", "POST"): "login 404 login login 404",
    ("prompt-page", "GET"): "login 404 login login 404",
    ("prompt-submit", "POST"): "login 404 login login 403",
    ("sagas:artifact", "GET"): "login 404 login login 200",
    ("sagas:artifact-upload", "POST"): "login 404 login login 400",
    ("api-collaborator-steer", "POST"): "401 404 404 403 403",
    ("api-collaborator-token", "DELETE"): "401 404 404 403 403",
    ("api-collaborator-token", "POST"): "401 404 404 403 403",
    ("api-collaborators", "GET"): "401 404 404 200 200",
    ("api-collaborators", "POST"): "401 404 404 400 400",
    ("api-docs", "GET"): "200 200 200 200 200",
    ("api-human-request", "GET"): "401 404 404 404 404",
    ("api-human-request-answer", "POST"): "401 400 400 400 400",
    ("api-human-request-list", "GET"): "401 200 200 200 200",
    ("api-human-requests", "POST"): "401 404 404 400 400",
    ("api-journal", "GET"): "401 404 404 200 200",
    ("api-not-found", "DELETE"): "401 404 404 404 404",
    ("api-not-found", "GET"): "401 404 404 404 404",
    ("api-not-found", "POST"): "401 404 404 404 404",
    ("api-request", "GET"): "401 404 404 404 404",
    ("api-request-cancel", "POST"): "401 404 404 404 404",
    ("api-request-reply", "POST"): "401 404 404 404 404",
    ("api-requests", "POST"): "401 404 404 400 400",
    ("api-remote-agent", "DELETE"): "401 404 404 403 403",
    ("api-remote-agents", "GET"): "401 404 404 200 200",
    ("api-remote-agents", "POST"): "401 404 404 403 403",
    ("api-run-status", "POST"): "401 400 400 400 400",
    ("api-saga", "GET"): "401 404 404 200 200",
    ("api-saga-finish", "POST"): "401 404 404 403 403",
    ("api-sagas", "GET"): "401 200 200 200 200",
    ("api-sagas", "POST"): "401 400 403 403 400",
    ("api-schema", "GET"): "200 200 200 200 200",
    ("api-steering", "GET"): "401 403 200 200 403",
    ("api-token", "POST"): "400 400 400 400 400",
    ("healthz", "GET"): "503 503 503 503 503",
    ("healthz", "POST"): "503 503 503 503 503",
    ("journal-export", "GET"): "401 404 404 200 200",
    ("metrics", "GET"): "403 403 403 403 403",  # no one's session or API token: AGORA_METRICS_TOKEN, unset here
    ("login", "GET"): "200 200 200 200 200",
    ("login", "POST"): "200 200 200 200 200",
    ("logout", "POST"): "login login login login login",
    ("password_change", "GET"): "login 200 login login 200",
    ("password_change", "POST"): "login 200 login login 200",
    ("password_change_done", "GET"): "login 200 login login 200",
    ("password_reset", "GET"): "200 200 200 200 200",
    ("password_reset", "POST"): "200 200 200 200 200",
    ("password_reset_complete", "GET"): "200 200 200 200 200",
    ("password_reset_confirm", "GET"): "200 200 200 200 200",
    ("password_reset_confirm", "POST"): "200 200 200 200 200",
    ("password_reset_done", "GET"): "200 200 200 200 200",
    ("sagas:add-agent", "POST"): "login 404 login login 403",
    ("sagas:add-person", "POST"): "login 404 login login 403",
    ("sagas:agent-token", "POST"): "login 404 login login 403",
    ("sagas:answer", "POST"): "login 404 login login 404",
    ("sagas:create", "POST"): "login 400 login login 400",
    ("sagas:detail", "GET"): "login 404 login login 200",
    ("sagas:exposure", "POST"): "login 404 login login 403",
    ("sagas:finish", "POST"): "login 404 login login 403",
    ("sagas:journal", "GET"): "login 404 login login 400",
    ("sagas:list", "GET"): "login 200 login login 200",
    ("sagas:part", "GET"): "login 404 login login 200",
    ("sagas:steer", "POST"): "login 404 login login 400",
    ("sagas:remote-agent-allow", "POST"): "login 404 login login 403",
    ("sagas:remote-agent-remove", "POST"): "login 404 login login 403",
}


def routes(patterns: list[Any], namespace: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":
                yield "admin", entry  # type: ignore[misc]
                continue
            inner = f"{namespace}:{entry.namespace}" if namespace and entry.namespace else entry.namespace or namespace
            yield from routes(entry.url_patterns, inner)
        elif isinstance(entry, URLPattern):
            if entry.name is None:
                raise AssertionError(f"An unnamed route cannot be classified: {entry.pattern}")
            yield (f"{namespace}:{entry.name}" if namespace else entry.name), entry


class Cast:
    def __init__(self, team: Team, other: Team, alice: User, bob: User, mallory: User) -> None:
        self.team = team
        lead, coder = team["lead"], team["coder"]
        request, _ = actions.ask_agent(sender=lead, to="agent:coder", type="t", payload={}, idempotency_key="m")
        form, _ = actions.ask_human(
            asker=coder, title="T", fields=[{"name": "n", "type": "text"}], to="human:alice", idempotency_key="m"
        )
        artifact = actions.add_artifact(
            saga=team.saga, name="notes.txt", content=b"notes", content_type="text/plain", by=alice
        )
        self.kwargs = {
            "saga_id": team.saga.pk, "cid": "agent:coder", "request_id": request.pk,
            "human_request_id": form.pk, "run_id": team.run("coder").pk, "part": "team",
            "uidb64": "MQ", "token": "set-password", "lead": "agent:lead", "name": artifact.name,
            # No prompt of this saga: the orchestrator's own tests cover who reads one.
            "prompt_id": "00000000-0000-4000-8000-000000000000",
        }  # fmt: skip
        self.people = {"owner": alice, "outsider": mallory, "colleague": bob}
        self.tokens = {
            "foreign": issue_token(user=other.user("spy")),
            "unaddressed": issue_token(user=team.user("scout")),
        }

        self.clients: dict[str, Client] = {}

    def client(self, role: str) -> Client:
        if role not in self.clients:
            if role in self.tokens:
                self.clients[role] = Client(HTTP_AUTHORIZATION=f"Bearer {self.tokens[role]}")
            else:
                self.clients[role] = client = Client()
                if role in self.people:
                    client.force_login(self.people[role])
        return self.clients[role]

    def url(self, name: str, pattern: URLPattern) -> str:
        if name == "api-not-found":
            return "/api/v1/no-such-thing/"
        names = set(getattr(pattern.pattern, "converters", {})) | set(pattern.pattern.regex.groupindex)
        return reverse(name, kwargs={k: self.kwargs[k] for k in names})


def outcome(response: Any) -> str:
    if response.status_code in (301, 302) and "login" in response.get("Location", ""):
        return "login"
    return str(response.status_code)


def call(client: Client, method: str, url: str) -> Any:
    return getattr(client, method.lower())(url, {} if method != "GET" else None, content_type="application/json")


@pytest.fixture
def cast(team: Team, other_team: Team, alice: User, bob: User, mallory: User, settings: LazySettings) -> Cast:
    # The matrix signs in many times from one address: the throttles are not what it tests.
    settings.AGORA_SIGNIN_RATE_PER_ADDRESS = settings.AGORA_SIGNIN_RATE_PER_ACCOUNT = "10000/d"
    return Cast(team, other_team, alice, bob, mallory)


def offered(pattern: URLPattern, url: str, cast: Cast) -> list[str]:
    """The methods a route serves: an API view's handlers, or for a page those that do not answer
    405 to the saga's owner."""
    api = getattr(pattern.callback, "cls", None)
    if api is not None:
        return [m for m in METHODS if hasattr(api, m.lower())]
    return [m for m in ("GET", "POST") if call(cast.client("owner"), m, url).status_code != 405]


def observed_matrix(cast: Cast) -> dict[tuple[str, str], str]:
    observed = {}
    for name, pattern in routes(get_resolver().url_patterns):
        if name == "admin":
            continue
        url = cast.url(name, pattern)
        for method in offered(pattern, url, cast):
            observed[(name, method)] = " ".join(outcome(call(cast.client(r), method, url)) for r in ROLES)
            if name == "logout":
                cast.clients.clear()  # the probe signed everyone out
    return observed


def test_every_route_answers_each_role_as_stated(cast: Cast) -> None:
    observed = observed_matrix(cast)
    unclassified = {k: v for k, v in observed.items() if k not in EXPECTED}
    wrong = {k: (EXPECTED[k], v) for k, v in observed.items() if k in EXPECTED and EXPECTED[k] != v}
    gone = set(EXPECTED) - set(observed)
    rows = "\n".join(f'    {k!r}: "{v}",' for k, v in sorted(unclassified.items()))
    assert not unclassified, f"Routes nobody classified yet; check each outcome, then add to EXPECTED:\n{rows}"
    assert not wrong, f"(expected, observed) differ: {wrong}"
    assert not gone, f"EXPECTED names routes that no longer exist: {gone}"


def test_the_admin_is_for_staff_only(cast: Cast) -> None:
    urls = ["/admin/"] + [
        reverse(f"admin:{m._meta.app_label}_{m._meta.model_name}_changelist") for m in admin.site._registry
    ]
    for url in urls:
        assert [outcome(cast.client(r).get(url)) for r in ROLES] == ["login"] * len(ROLES), url


WEBSOCKET_EXPECTED = {"anonymous": False, "outsider": False, "foreign": False, "unaddressed": True, "colleague": True}


@pytest.mark.django_db(transaction=True)
async def test_the_journal_websocket_opens_for_collaborators_only(cast: Cast, bob: User, mallory: User) -> None:
    # The one socket, and the refusal of every other path (as an unknown saga).
    assert [str(p.pattern) for p in websocket_urlpatterns] == ["ws/sagas/<uuid:saga_id>/journal/", ""]
    from channels.db import database_sync_to_async

    def headers(role: str) -> list[tuple[bytes, bytes]]:
        sent = [(b"origin", b"http://localhost")]
        if role in cast.tokens:
            sent.append((b"authorization", f"Bearer {cast.tokens[role]}".encode()))
        elif role != "anonymous":
            sent.append((b"cookie", f"sessionid={cast.client(role).cookies['sessionid'].value}".encode()))
        return sent

    opened = {}
    for role in ROLES:
        sent = await database_sync_to_async(headers)(role)
        socket = WebsocketCommunicator(application, f"/ws/sagas/{cast.team.saga.pk}/journal/", headers=sent)
        connected, _ = await socket.connect(timeout=10)
        opened[role] = connected
        await socket.disconnect()
    assert opened == WEBSOCKET_EXPECTED
