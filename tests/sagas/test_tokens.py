"""An agent's token is rotated or revoked over REST and from the dashboard; a revocation holds on
the next call, on an open WebSocket and on a waiting long-poll; no token is ever written to the
journal, its export or the logs."""

import logging
import re
import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from redis import Redis
from rest_framework.test import APIClient

from accounts.actions import issue_token
from accounts.models import ApiToken, User, hash_token
from config.asgi import application
from journal.models import JournalEvent
from sagas import actions
from tests.sagas.api_http import Http, client_for, problem
from tests.sagas.kernel import Team, profile_named
from tests.support import WebServer, wait_until

pytestmark = pytest.mark.usefixtures("fast_passwords")


def token_path(team: Team, name: str) -> str:
    return f"/api/v1/sagas/{team.saga.pk}/collaborators/agent:{name}/token/"


def bearer(key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return api


def test_a_manager_rotates_an_agents_token_and_the_old_one_stops_working(team: Team, alice: User) -> None:
    old = issue_token(user=team.user("coder"))
    assert bearer(old).get("/api/v1/steering/").status_code == 200
    rotated = client_for(alice).post(token_path(team, "coder"))
    assert rotated.status_code == 200 and rotated["Cache-Control"] == "no-store"
    assert rotated.data["id"] == "agent:coder"
    problem(bearer(old).get("/api/v1/steering/"), 401, "authentication_failed")
    assert bearer(rotated.data["token"]).get("/api/v1/steering/").status_code == 200
    event = JournalEvent.objects.get(saga=team.saga, type="collaborator.token_rotated")
    assert event.data == {"id": "agent:coder"} and event.actor == "human:alice"


def test_an_agent_rotates_and_revokes_its_own_token_and_no_one_elses(team: Team, bob: User, mallory: User) -> None:
    coder = client_for(team.user("coder"), "Bearer")
    problem(coder.post(token_path(team, "tester")), 403, "forbidden")  # its delegate: still not its token
    problem(client_for(bob).delete(token_path(team, "coder")), 403, "forbidden")  # a collaborator, not a manager
    problem(client_for(mallory).delete(token_path(team, "coder")), 404, "not_found")
    problem(client_for(team.user("tester"), "Bearer").post(token_path(team, "nobody")), 404, "not_found")
    fresh = coder.post(token_path(team, "coder")).data["token"]
    problem(coder.get("/api/v1/steering/"), 401, "authentication_failed")  # its old token
    mine = bearer(fresh)
    assert mine.delete(token_path(team, "coder")).status_code == 204
    problem(mine.get("/api/v1/steering/"), 401, "authentication_failed")
    assert not ApiToken.objects.filter(user=team.user("coder")).exists()


def test_an_internal_agent_has_no_token_to_rotate(team: Team, alice: User) -> None:
    """Agora runs an internal agent's turns: a token for it would let a manager act as it (drain
    its steering, ask as it)."""
    actions.add_agent(saga=team.saga, name="inside", role="Inside", task="t", runtime="internal",
                      profile=profile_named("inside"), by=alice)  # fmt: skip

    problem(client_for(alice).post(token_path(team, "inside")), 409, "invalid_state")
    page = Client()
    page.force_login(alice)
    refused = page.post(f"/sagas/{team.saga.pk}/agent-token/", {"agent": "agent:inside", "action": "rotate"})
    assert (refused.status_code, refused.content) == (
        409,
        b"invalid_state: agent:inside runs inside Agora: it has no API token.",
    )

    assert not ApiToken.objects.filter(user__username__endswith=".inside").exists()
    assert not JournalEvent.objects.filter(saga=team.saga, type="collaborator.token_rotated").exists()


def test_a_finished_saga_issues_no_new_token_but_still_revokes(team: Team, alice: User, bob: User) -> None:
    """A token is work started: a finished saga refuses to issue one, as it refuses every write
    that starts work; taking a token away stays possible."""
    old = issue_token(user=team.user("scout"))
    actions.finish_saga(saga=team.saga, status="completed", by=alice)
    held = set(ApiToken.objects.filter(user=team.user("scout")).values_list("key_hash", flat=True))

    problem(client_for(alice).post(token_path(team, "scout")), 409, "saga_finished")
    problem(bearer(old).post(token_path(team, "scout")), 409, "saga_finished")  # the agent itself
    problem(client_for(bob).post(token_path(team, "scout")), 403, "forbidden")  # who first, then when
    page = Client()
    page.force_login(alice)
    url = f"/sagas/{team.saga.pk}/agent-token/"
    refused = page.post(url, {"agent": "agent:scout", "action": "rotate"})
    assert (refused.status_code, refused.content) == (
        409,
        b"saga_finished: The saga is completed: it takes no new work.",
    )
    assert set(ApiToken.objects.filter(user=team.user("scout")).values_list("key_hash", flat=True)) == held
    assert not JournalEvent.objects.filter(saga=team.saga, type="collaborator.token_rotated").exists()

    assert page.post(url, {"agent": "agent:scout", "action": "revoke"}).status_code == 302
    assert client_for(alice).delete(token_path(team, "lead")).status_code == 204
    assert not ApiToken.objects.filter(user__in=[team.user("scout"), team.user("lead")]).exists()
    assert len(JournalEvent.objects.filter(saga=team.saga, type="collaborator.token_revoked")) == 2


def test_the_dashboard_rotates_and_revokes_for_managers_only(team: Team, alice: User, bob: User) -> None:
    old = issue_token(user=team.user("scout"))
    browser = Client()
    browser.force_login(alice)
    url = f"/sagas/{team.saga.pk}/agent-token/"
    page = browser.post(url, {"agent": "agent:scout", "action": "rotate"})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    assert b"has a new token" in page.content
    shown = re.search(r"<code>(agt_[\w-]+)</code>", page.content.decode())
    assert shown is not None and bearer(shown[1]).get("/api/v1/steering/").status_code == 200
    problem(bearer(old).get("/api/v1/steering/"), 401, "authentication_failed")
    assert browser.post(url, {"agent": "agent:scout", "action": "revoke"}).status_code == 302
    assert not ApiToken.objects.filter(user=team.user("scout")).exists()
    colleague = Client()
    colleague.force_login(bob)
    assert colleague.post(url, {"agent": "agent:coder", "action": "revoke"}).status_code == 403
    assert browser.post(url, {"agent": "agent:ghost", "action": "revoke"}).status_code == 404


@pytest.mark.django_db(transaction=True)
async def test_a_revocation_closes_an_open_websocket(team: Team, alice: User) -> None:
    key = await database_sync_to_async(issue_token)(user=await database_sync_to_async(team.user)("lead"))
    headers = [(b"origin", b"http://localhost"), (b"authorization", f"Bearer {key}".encode())]
    socket = WebsocketCommunicator(application, f"/ws/sagas/{team.saga.pk}/journal/?after=0", headers=headers)
    connected, _ = await socket.connect(timeout=10)
    assert connected
    try:
        await database_sync_to_async(actions.revoke_agent_token)(saga=team.saga, handle="agent:lead", by=alice)
        while (output := await socket.receive_output(timeout=10))["type"] == "websocket.send":
            pass  # the replay, however slowly it comes
        assert output == {"type": "websocket.close", "code": 4401}
    finally:
        await socket.disconnect()


@pytest.mark.django_db(transaction=True)
def test_a_revocation_ends_a_waiting_long_poll(team: Team, alice: User, web_server: WebServer, redis_url: str) -> None:
    agent = Http(web_server.url, issue_token(user=team.user("reviewer")))
    replies: list[Any] = []
    poll = threading.Thread(target=lambda: replies.append(agent.get("/api/v1/steering/?after=0&wait=30")))
    poll.start()
    try:
        # It waits once it holds a wait slot (a revocation before that is the next-call case).
        waits = f"agora:waits:agent:{team['reviewer'].pk}"
        with Redis.from_url(redis_url) as slots:
            wait_until(lambda: slots.zcard(waits) == 1, what="the long-poll to wait")
        actions.revoke_agent_token(saga=team.saga, handle="agent:reviewer", by=alice)
        poll.join(timeout=10)
        assert not poll.is_alive(), "the long-poll outlived its token"
    finally:
        poll.join()
    replies[0].problem(401, "authentication_failed")


@pytest.mark.django_db(transaction=True)
def test_no_token_reaches_the_journal_its_export_or_the_logs(
    team: Team, alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    manager = client_for(alice)
    added = manager.post(
        f"/api/v1/sagas/{team.saga.pk}/collaborators/",
        {"kind": "agent", "name": "outside", "role": "R", "task": "t", "runtime": "external"},
        format="json",
    )
    keys = [added.data["token"], manager.post(token_path(team, "outside")).data["token"]]
    bearer(keys[1]).get("/api/v1/steering/")
    bearer(keys[0]).get("/api/v1/steering/")  # a revoked one, refused and perhaps logged
    exported = manager.get(f"/api/v1/sagas/{team.saga.pk}/journal.jsonl").getvalue().decode()
    journal = [str(e.data) for e in JournalEvent.objects.filter(saga=team.saga)]
    for key in keys:
        assert key not in exported and not any(key in data for data in journal)
        assert key not in caplog.text
        assert key[12:] not in exported + caplog.text  # not even past the recognisable prefix
    stored = ApiToken.objects.get(user__username__endswith=".outside")
    assert stored.key_hash == hash_token(keys[1]) and stored.prefix == keys[1][:12]  # the hash, never the key
