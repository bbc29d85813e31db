"""Requests between agents over the API: who may send, see, reply and cancel; idempotency; limits.

In-process calls go through DRF's APIClient (the async views run under the test client too, as
long as they do not wait); waits and races run against a real daphne process (`web_server`)."""

import http.client
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import LazySettings
from rest_framework.response import Response
from rest_framework.test import APIClient

from accounts.actions import issue_token
from journal.models import JournalEvent
from sagas.models import AgentRequest, SteeringItem
from tests.sagas.api_http import Http, client_for, problem
from tests.sagas.kernel import Team, journal, last_seq
from tests.support import WebServer, wait_until

Client = Callable[[str], APIClient]

# No password leaves this process here (agents use tokens), so the cast's may be hashed cheaply.
pytestmark = pytest.mark.usefixtures("fast_passwords")


@pytest.fixture
def as_agent(team: Team) -> Client:
    """An APIClient authenticated as one of the team's agents, with its own token."""

    def client(name: str) -> APIClient:
        return client_for(team.user(name), "Bearer")

    return client


def ask(api: APIClient, team: Team, body: dict[str, Any], **headers: str) -> Response:
    response: Response = api.post(f"/api/v1/sagas/{team.saga.pk}/requests/", body, format="json", headers=headers)
    return response


def test_the_sender_is_the_caller_whatever_the_body_says(team: Team, as_agent: Client) -> None:
    tester = as_agent("tester")
    asked = ask(tester, team, {"to": "agent:coder", "type": "check", "payload": {}, "from": "agent:lead"})
    assert asked.status_code == 202
    request = AgentRequest.objects.select_related("sender").get(pk=asked.data["request_id"])
    assert request.sender.handle == "agent:tester"
    assert SteeringItem.objects.get(request=request, kind="request").sender == "agent:tester"
    assert tester.get(f"/api/v1/requests/{request.pk}/").data["from"] == "agent:tester"


def test_an_agent_of_another_saga_finds_nothing_of_ours(team: Team, other_team: Team, as_agent: Client) -> None:
    spy = client_for(other_team.user("spy"), "Bearer")
    ours = ask(as_agent("tester"), team, {"to": "agent:coder", "type": "check", "payload": {}}).data["request_id"]
    absent_saga = "00000000-0000-4000-8000-000000000000"
    seen: list[str] = []

    # Our saga looks exactly like a saga that does not exist...
    body = {"to": "agent:coder", "type": "check", "payload": {}}
    for saga_id in (team.saga.pk, absent_saga):
        replies = [
            spy.post(f"/api/v1/sagas/{saga_id}/requests/", body, format="json"),
            spy.get(f"/api/v1/sagas/{saga_id}/collaborators/"),
            spy.get(f"/api/v1/sagas/{saga_id}/journal/"),
            spy.get(f"/api/v1/sagas/{saga_id}/"),
        ]
        details = [problem(reply, 404, "not_found")["detail"].replace(str(saga_id), "ID") for reply in replies]
        if saga_id == absent_saga:
            assert details == seen
        seen = details
    # ...our agents, addressed from its own saga, look like agents that do not exist...
    real = problem(ask(spy, other_team, {"to": "agent:tester", "type": "x", "payload": {}}), 404, "not_found")
    fake = problem(ask(spy, other_team, {"to": "agent:nobody", "type": "x", "payload": {}}), 404, "not_found")
    assert real["detail"].replace("tester", "NAME") == fake["detail"].replace("nobody", "NAME")
    # ...and so do our requests.
    real = problem(spy.get(f"/api/v1/requests/{ours}/"), 404, "not_found")
    fake = problem(spy.get("/api/v1/requests/req-doesnotexist/"), 404, "not_found")
    assert real["detail"].replace(ours, "ID") == fake["detail"].replace("req-doesnotexist", "ID")
    problem(spy.post(f"/api/v1/requests/{ours}/reply/", {"payload": 1}, format="json"), 404, "not_found")
    problem(spy.post(f"/api/v1/requests/{ours}/cancel/"), 404, "not_found")
    assert AgentRequest.objects.get(pk=ours).status == "pending"


def test_only_the_recipient_replies_and_only_once(team: Team, as_agent: Client, bob: Any) -> None:
    tester, coder = as_agent("tester"), as_agent("coder")
    rid = ask(tester, team, {"to": "agent:coder", "type": "check", "payload": {}}).data["request_id"]

    problem(tester.post(f"/api/v1/requests/{rid}/reply/", {"payload": 1}, format="json"), 403, "forbidden")
    person = client_for(bob)  # a collaborator, not a party
    problem(person.post(f"/api/v1/requests/{rid}/reply/", {"payload": 1}, format="json"), 404, "not_found")
    problem(coder.post(f"/api/v1/requests/{rid}/reply/", {}, format="json"), 400, "invalid_payload")

    first = coder.post(f"/api/v1/requests/{rid}/reply/", {"payload": {"ok": True}}, format="json")
    assert (first.status_code, first.data) == (200, {"request_id": rid, "status": "completed"})
    problem(
        coder.post(f"/api/v1/requests/{rid}/reply/", {"payload": {"ok": False}}, format="json"), 409, "already_answered"
    )
    assert AgentRequest.objects.get(pk=rid).reply == {"ok": True}
    assert SteeringItem.objects.filter(request_id=rid, kind="response").count() == 1
    # Only the sender cancels; a finished request is not cancelled after the fact.
    problem(coder.post(f"/api/v1/requests/{rid}/cancel/"), 403, "forbidden")
    problem(tester.post(f"/api/v1/requests/{rid}/cancel/"), 409, "already_answered")


def test_an_error_reply_fails_the_request_and_reaches_the_sender(team: Team, as_agent: Client) -> None:
    tester, coder = as_agent("tester"), as_agent("coder")
    rid = ask(tester, team, {"to": "agent:coder", "type": "check", "payload": {}}).data["request_id"]
    error = {"code": "unsupported", "message": "No v1 here."}
    assert coder.post(f"/api/v1/requests/{rid}/reply/", {"error": error}, format="json").data["status"] == "failed"
    [item] = tester.get("/api/v1/steering/?after=0").data["items"]
    assert (item["kind"], item["status"], item["payload"], item["error"]) == ("response", "failed", None, error)


def test_an_idempotency_key_replays_the_first_request_and_refuses_another_body(team: Team, as_agent: Client) -> None:
    tester = as_agent("tester")
    body = {"to": "agent:coder", "type": "check", "payload": {"n": 1}}
    first = ask(tester, team, body, **{"Idempotency-Key": "call-1"})
    again = ask(tester, team, body, **{"Idempotency-Key": "call-1"})
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.data == again.data
    assert again["Idempotent-Replayed"] == "true"
    assert first["Location"] == again["Location"] == f"/api/v1/requests/{first.data['request_id']}/"
    assert tester.get(first["Location"]).data["status"] == "pending"
    problem(
        ask(tester, team, {**body, "payload": {"n": 2}}, **{"Idempotency-Key": "call-1"}), 409, "idempotency_conflict"
    )
    # A wait's timeout is its body's too, once given: another one is another body (async has none).
    timed = {**body, "mode": "wait", "timeout_s": 0.2}
    assert ask(tester, team, timed, **{"Idempotency-Key": "call-2"}).status_code == 202  # timed out
    assert ask(tester, team, timed, **{"Idempotency-Key": "call-2"}).status_code == 202
    longer = {**timed, "timeout_s": 250}
    problem(ask(tester, team, longer, **{"Idempotency-Key": "call-2"}), 409, "idempotency_conflict")
    untimed = {**body, "mode": "async", "timeout_s": 5}
    assert ask(tester, team, untimed, **{"Idempotency-Key": "call-3"}).status_code == 202
    assert ask(tester, team, {**untimed, "timeout_s": 9}, **{"Idempotency-Key": "call-3"}).status_code == 202
    assert AgentRequest.objects.filter(sender=team["tester"]).count() == 3


@pytest.mark.parametrize("resumable", [False, True])
def test_an_agent_whose_run_has_ended_asks_no_more(make_team: Callable[..., Team], resumable: bool) -> None:
    """Its run over, an external agent keeps its token but no longer asks, as it asks no person
    (`invalid_state`); a retry of an ask it made before gets that ask. Only its own report of
    `working` (a resumable one) brings it back."""
    team = make_team(resumable=["coder"] if resumable else [])
    coder = client_for(team.user("coder"), "Bearer")
    body = {"to": "agent:tester", "type": "check", "payload": {}}
    first = ask(coder, team, body, **{"Idempotency-Key": "k1"}).data["request_id"]
    status = f"/api/v1/runs/{team.run('coder').pk}/status/"
    assert coder.post(status, {"status": "finished"}, format="json").status_code == 200
    mark = last_seq(team.saga)

    refused = problem(ask(coder, team, body), 409, "invalid_state")
    assert refused["detail"] == "agent:coder has ended (completed): it asks no more."
    replayed = ask(coder, team, body, **{"Idempotency-Key": "k1"})
    assert (replayed.status_code, replayed.data["request_id"]) == (202, first)
    assert list(AgentRequest.objects.values_list("pk", flat=True)) == [first]
    assert journal(team.saga, after=mark) == []

    back = coder.post(status, {"status": "working"}, format="json")
    if resumable:
        assert back.status_code == 200 and ask(coder, team, body).status_code == 202
    else:
        problem(back, 409, "invalid_state")


def test_hop_limit(team: Team, as_agent: Client, settings: LazySettings) -> None:
    settings.AGORA_MAX_HOPS = 2
    ask(as_agent("lead"), team, {"to": "agent:coder", "type": "a", "payload": {}})  # hop 1
    assert ask(as_agent("coder"), team, {"to": "agent:tester", "type": "b", "payload": {}}).status_code == 202  # hop 2
    body = problem(ask(as_agent("tester"), team, {"to": "agent:coder", "type": "c", "payload": {}}), 409, "hop_limit")
    assert "limit is 2" in body["detail"]
    assert not AgentRequest.objects.filter(type="c").exists()


def test_pending_cap_per_sender(team: Team, as_agent: Client, settings: LazySettings) -> None:
    settings.AGORA_MAX_PENDING_PER_SENDER = 2
    scout = as_agent("scout")
    for n in range(2):
        assert ask(scout, team, {"to": "agent:lead", "type": f"t{n}", "payload": {}}).status_code == 202
    problem(ask(scout, team, {"to": "agent:lead", "type": "t2", "payload": {}}), 429, "too_many_pending")
    # Another sender is not held back by the scout's backlog.
    assert ask(as_agent("coder"), team, {"to": "agent:lead", "type": "t3", "payload": {}}).status_code == 202


def test_policy_refuses_agents_outside_the_senders_reach(make_team: Callable[..., Team]) -> None:
    hub = make_team(policy="hub")
    api = client_for(hub.user("tester"), "Bearer")
    problem(ask(api, hub, {"to": "agent:reviewer", "type": "x", "payload": {}}), 404, "not_found")  # not visible
    problem(
        ask(api, hub, {"to": "agent:lead", "type": "x", "payload": {}}), 403, "not_addressable"
    )  # seen, not its hub
    assert ask(api, hub, {"to": "agent:coder", "type": "x", "payload": {}}).status_code == 202  # its delegator


def test_a_payload_over_the_limit_is_413_and_stores_nothing(team: Team, as_agent: Client) -> None:
    tester = as_agent("tester")
    before = (AgentRequest.objects.count(), SteeringItem.objects.count(), JournalEvent.objects.count())
    over = {"to": "agent:coder", "type": "big", "payload": {"blob": "x" * (256 * 1024)}}
    body = problem(ask(tester, team, over), 413, "payload_too_large")
    assert "262144" in body["detail"]
    huge = {"to": "agent:coder", "type": "big", "payload": {"blob": "x" * (3 * 1024 * 1024)}}
    body = problem(ask(tester, team, huge), 413, "payload_too_large")  # refused before it is even parsed
    assert body["detail"] == f"Limit is {256 * 1024 + 64 * 1024} bytes for a request body."
    assert (AgentRequest.objects.count(), SteeringItem.objects.count(), JournalEvent.objects.count()) == before

    rid = ask(tester, team, {"to": "agent:coder", "type": "small", "payload": {}}).data["request_id"]
    coder = as_agent("coder")
    problem(
        coder.post(f"/api/v1/requests/{rid}/reply/", {"payload": "y" * 300_000}, format="json"),
        413,
        "payload_too_large",
    )
    assert AgentRequest.objects.get(pk=rid).status == "pending"


def test_malformed_json_is_400_invalid_payload(team: Team, as_agent: Client) -> None:
    tester = as_agent("tester")
    path = f"/api/v1/sagas/{team.saga.pk}/requests/"
    problem(
        tester.post(path, b'{"to": "agent:coder", "type": ', content_type="application/json"), 400, "invalid_payload"
    )
    body = problem(tester.post(path, {"type": 3, "mode": "maybe"}, format="json"), 400, "invalid_payload")
    assert set(body["errors"]) >= {"to", "mode"}
    assert not AgentRequest.objects.exists()


# --- against a real web server -------------------------------------------------------------------


def agent_http(server: WebServer, team: Team, name: str) -> Http:
    return Http(server.url, issue_token(user=team.user(name)))


def test_the_same_idempotency_key_eight_times_at_once_makes_one_request(web_server: WebServer, team: Team) -> None:
    tester = agent_http(web_server, team, "tester")
    path = f"/api/v1/sagas/{team.saga.pk}/requests/"
    body = {"to": "agent:coder", "type": "check", "payload": {"n": 1}}
    start = threading.Barrier(8)

    def send(_: int) -> Any:
        start.wait()
        return tester.post(path, body, headers={"Idempotency-Key": "retry-me"}).ok(202)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(send, range(8)))
    assert len({r["request_id"] for r in results}) == 1
    assert AgentRequest.objects.filter(sender=team["tester"]).count() == 1
    assert SteeringItem.objects.filter(recipient=team["coder"], kind="request").count() == 1
    assert JournalEvent.objects.filter(saga=team.saga, type="request.created").count() == 1


def test_an_idempotent_replay_of_a_wait_returns_the_completed_outcome(web_server: WebServer, team: Team) -> None:
    tester, coder = agent_http(web_server, team, "tester"), agent_http(web_server, team, "coder")
    path = f"/api/v1/sagas/{team.saga.pk}/requests/"
    body = {"to": "agent:coder", "type": "check", "payload": {}, "mode": "wait", "timeout_s": 30}
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(tester.post, path, body, headers={"Idempotency-Key": "w-1"})
        item = coder.steering_item(0, lambda i: i["kind"] == "request")
        coder.post(f"/api/v1/requests/{item['request_id']}/reply/", {"payload": {"done": 1}}).ok(200)
        outcome = first.result(timeout=40).ok(200)
    replay = tester.post(path, body, headers={"Idempotency-Key": "w-1"})
    assert (
        replay.ok(200)
        == outcome
        == {
            "request_id": item["request_id"],
            "status": "completed",
            "from": "agent:coder",
            "payload": {"done": 1},
        }
    )
    assert replay.headers["idempotent-replayed"] == "true"


def test_cancel_racing_reply_has_exactly_one_winner(web_server: WebServer, team: Team) -> None:
    tester, coder = agent_http(web_server, team, "tester"), agent_http(web_server, team, "coder")
    for round_ in range(4):
        rid = tester.post(
            f"/api/v1/sagas/{team.saga.pk}/requests/", {"to": "agent:coder", "type": f"race{round_}", "payload": {}}
        ).ok(202)["request_id"]
        start = threading.Barrier(2)

        def cancel(rid: str = rid, start: threading.Barrier = start) -> Any:
            start.wait()
            return tester.post(f"/api/v1/requests/{rid}/cancel/")

        def reply(rid: str = rid, start: threading.Barrier = start) -> Any:
            start.wait()
            return coder.post(f"/api/v1/requests/{rid}/reply/", {"payload": {"won": True}})

        with ThreadPoolExecutor(max_workers=2) as pool:
            cancelled, replied = pool.submit(cancel), pool.submit(reply)
            c, r = cancelled.result(timeout=30), replied.result(timeout=30)
        assert sorted([c.status, r.status]) == [200, 409], (c.body, r.body)
        final = AgentRequest.objects.get(pk=rid).status
        if c.status == 200:
            assert final == "cancelled" and r.body["code"] == "request_cancelled"
        else:
            assert final == "completed" and c.body["code"] == "already_answered"
        terminal = JournalEvent.objects.filter(
            saga=team.saga, type__in=["request.cancelled", "request.completed"], data__request_id=rid
        )
        assert terminal.count() == 1


def test_a_wait_that_closes_a_cycle_is_refused_with_deadlock(web_server: WebServer, team: Team) -> None:
    coder, tester = agent_http(web_server, team, "coder"), agent_http(web_server, team, "tester")
    path = f"/api/v1/sagas/{team.saga.pk}/requests/"
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(
            coder.post, path, {"to": "agent:tester", "type": "a", "payload": {}, "mode": "wait", "timeout_s": 30}
        )
        first = wait_until(
            lambda: AgentRequest.objects.filter(sender=team["coder"], wait_deadline__isnull=False).first(),
            what="the coder's wait to be registered",
        )
        assert first is not None
        refused = tester.post(path, {"to": "agent:coder", "type": "b", "payload": {}, "mode": "wait", "timeout_s": 30})
        body = refused.problem(409, "deadlock")
        assert body["detail"] == f"agent:tester → agent:coder (this request) → agent:tester ({first.pk})"
        assert body["cycle"] == ["agent:tester", "agent:coder", "agent:tester"]
        # An async request is no wait: it goes through, and so does the reply that ends the first wait.
        tester.post(path, {"to": "agent:coder", "type": "b", "payload": {}}).ok(202)
        tester.post(f"/api/v1/requests/{first.pk}/reply/", {"payload": "done"}).ok(200)
        assert held.result(timeout=40).ok(200)["payload"] == "done"
    assert not AgentRequest.objects.filter(type="b", mode="wait").exists()


def test_a_chunked_body_is_411_over_http_and_stores_nothing(web_server: WebServer, team: Team) -> None:
    tester = agent_http(web_server, team, "tester")
    body = json.dumps({"to": "agent:coder", "type": "streamed", "payload": {"n": 1}}).encode()
    conn = http.client.HTTPConnection(tester.host, tester.port, timeout=30)
    try:  # a body given as an iterable, without a Content-Length: http.client sends it chunked
        headers = {"Authorization": f"Bearer {tester.token}", "Content-Type": "application/json"}
        conn.request("POST", f"/api/v1/sagas/{team.saga.pk}/requests/", body=iter([body]), headers=headers)
        response = conn.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        conn.close()
    assert (status, answer["code"]) == (411, "length_required")
    assert not AgentRequest.objects.exists()
    tester.post(f"/api/v1/sagas/{team.saga.pk}/requests/", raw=body).ok(202)  # the same body with its length


def test_an_ask_to_a_person_points_to_ask_human(team: Team, as_agent: Client) -> None:
    body = problem(
        ask(as_agent("tester"), team, {"to": "human:alice", "type": "x", "payload": {}}), 400, "invalid_payload"
    )
    assert "ask_human" in body["detail"] and "to" in body["errors"]
    assert not AgentRequest.objects.exists()


def test_a_body_over_the_server_limit_is_413_over_http(web_server: WebServer, team: Team) -> None:
    tester = agent_http(web_server, team, "tester")
    raw = json.dumps({"to": "agent:coder", "type": "big", "payload": "x" * (3 * 1024 * 1024)}).encode()
    tester.post(f"/api/v1/sagas/{team.saga.pk}/requests/", raw=raw).problem(413, "payload_too_large")
    tester.post(f"/api/v1/sagas/{team.saga.pk}/requests/", raw=b"{not json").problem(400, "invalid_payload")
    assert not AgentRequest.objects.exists()


def test_a_caller_that_hangs_up_resumes_the_same_wait_with_its_key(web_server: WebServer, team: Team) -> None:
    token = issue_token(user=team.user("tester"))
    impatient, tester = Http(web_server.url, token, timeout=1), Http(web_server.url, token)
    path = f"/api/v1/sagas/{team.saga.pk}/requests/"
    body = {"to": "agent:coder", "type": "slow", "payload": {}, "mode": "wait", "timeout_s": 4}
    with pytest.raises(TimeoutError):
        impatient.post(path, body, headers={"Idempotency-Key": "hang-up"})
    # The hang-up did not end the wait (a loaded server may still be writing the request, though).
    sent = AgentRequest.objects.filter(sender=team["tester"], wait_deadline__isnull=False)
    request = wait_until(sent.first, what="the request the hung-up call sent, still waited on")
    deadline = request.wait_deadline
    assert deadline is not None

    retried = tester.post(path, body, headers={"Idempotency-Key": "hang-up"})
    # The retry waited out the first call's deadline, neither returning at once nor starting anew.
    assert time.time() >= deadline.timestamp() - 0.05
    assert retried.ok(202) == {"request_id": request.pk, "status": "pending", "timed_out": True}
    request.refresh_from_db()
    assert (request.status, request.wait_deadline) == ("pending", None)
    assert AgentRequest.objects.filter(sender=team["tester"]).count() == 1
