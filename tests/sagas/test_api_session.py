"""The whole session of API_EXAMPLES.md, played over HTTP alone against a real daphne process by a
person and two external agents: nothing here calls the kernel directly except to check its state."""

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from accounts.models import User
from sagas.models import AgentRequest
from tests.sagas.api_http import Http
from tests.support import WebServer

pytestmark = pytest.mark.integration


def test_two_external_agents_run_the_protocol_over_http(web_server: WebServer, alice: User, bob: User) -> None:
    url = web_server.url
    token = Http(url).post("/api/v1/auth/token/", {"username": "alice", "password": "alice-password"}).ok(200)["token"]
    owner = Http(url, token, scheme="Token")

    # A saga, its two external agents (the second delegated by the first) and a person.
    saga = owner.post(
        "/api/v1/sagas/",
        {"title": "API v2 migration", "goal": "ship v2 without breaking clients", "policy": "tree"},
    ).ok(201)
    assert {k: saga[k] for k in ("title", "policy", "status", "owner")} == {
        "title": "API v2 migration",
        "policy": "tree",
        "status": "open",
        "owner": "human:alice",
    }
    assert saga["created_at"]
    base = f"/api/v1/sagas/{saga['id']}"
    coder_card = owner.post(
        f"{base}/collaborators/",
        {"kind": "agent", "name": "coder-01", "role": "Coder", "task": "Implement API", "runtime": "external"},
    ).ok(201)
    assert coder_card["id"] == "agent:coder-01" and coder_card["status"] == "idle"
    assert coder_card["run_id"].startswith("run-") and coder_card["token"].startswith("agt_")
    coder = Http(url, coder_card["token"])
    tester_card = coder.post(
        f"{base}/collaborators/",
        {"kind": "agent", "name": "tester-01", "role": "Tester", "task": "Test the API", "runtime": "external",
         "parent": "agent:coder-01"},
    ).ok(201)  # fmt: skip
    tester = Http(url, tester_card["token"])
    assert owner.post(
        f"{base}/collaborators/",
        {"kind": "human", "username": "bob", "role": "Business Analyst", "task": "Requirements analysis"},
    ).ok(201) == {"id": "human:bob", "kind": "human", "role": "Business Analyst", "task": "Requirements analysis"}

    # Discovery: the tester sees its delegator, itself and the people; never a token.
    seen = tester.get(f"{base}/collaborators/").ok(200)["collaborators"]
    assert {c["id"]: c.get("run_id") for c in seen} == {
        "agent:coder-01": coder_card["run_id"],
        "agent:tester-01": tester_card["run_id"],
        "human:alice": None,
        "human:bob": None,
    }
    assert all(set(c) <= {"id", "kind", "role", "task", "status", "run_id"} for c in seen)

    with ThreadPoolExecutor(max_workers=2) as pool:
        # An async request, picked up by the recipient's long-poll.
        poll = pool.submit(coder.get, "/api/v1/steering/?after=0&wait=20")
        asked = tester.post(
            f"{base}/requests/",
            {"to": "agent:coder-01", "type": "compatibility.check", "payload": {"api_change": "rename /users"},
             "mode": "async"},
            headers={"Idempotency-Key": "2b7e-1"},
        ).ok(202)  # fmt: skip
        rid = asked["request_id"]
        assert asked == {"request_id": rid, "status": "pending"}
        items = poll.result(timeout=30).ok(200)["items"]
    [request_item] = items
    assert request_item == {
        "seq": request_item["seq"],
        "kind": "request",
        "request_id": rid,
        "from": "agent:tester-01",
        "type": "compatibility.check",
        "payload": {"api_change": "rename /users"},
        "created_at": request_item["created_at"],
    }
    coder_cursor = request_item["seq"]
    # Acknowledging with the cursor marks it delivered; it is not handed out again after the cursor.
    assert coder.get(f"/api/v1/steering/?after={coder_cursor}").ok(200) == {"items": []}
    assert tester.get(f"/api/v1/requests/{rid}/").ok(200)["status"] == "delivered"

    reply = {"compatible": False, "reason": "The API change breaks backward compatibility."}
    assert coder.post(f"/api/v1/requests/{rid}/reply/", {"payload": reply}).ok(200) == {
        "request_id": rid,
        "status": "completed",
    }
    response_item = tester.steering_item(0, lambda i: i["request_id"] == rid)
    assert {k: response_item[k] for k in ("kind", "from", "type", "status", "payload")} == {
        "kind": "response",
        "from": "agent:coder-01",
        "type": "compatibility.check",
        "status": "completed",
        "payload": reply,
    }
    tester_cursor = response_item["seq"]

    # A wait answered within the wait: 200 with the reply.
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(
            tester.post,
            f"{base}/requests/",
            {"to": "agent:coder-01", "type": "schema.review", "payload": {"schema": "v2"}, "mode": "wait",
             "timeout_s": 30},
        )  # fmt: skip
        review = coder.steering_item(coder_cursor, lambda i: i["type"] == "schema.review")
        coder_cursor = review["seq"]
        coder.post(f"/api/v1/requests/{review['request_id']}/reply/", {"payload": {"approved": True}}).ok(200)
        answered = waiting.result(timeout=40).ok(200)
    assert answered == {
        "request_id": review["request_id"],
        "status": "completed",
        "from": "agent:coder-01",
        "payload": {"approved": True},
    }

    # A wait that times out: 202 `timed_out`, the waits-for edge is gone, the reply comes later via steering.
    started = time.monotonic()
    timed_out = tester.post(
        f"{base}/requests/",
        {"to": "agent:coder-01", "type": "load.test", "payload": {}, "mode": "wait", "timeout_s": 1},
    ).ok(202)
    assert time.monotonic() - started >= 0.9
    late = timed_out["request_id"]
    assert timed_out == {"request_id": late, "status": "pending", "timed_out": True}
    assert AgentRequest.objects.get(pk=late).wait_deadline is None
    assert tester.get(f"/api/v1/requests/{late}/").ok(200)["status"] == "pending"
    coder.post(f"/api/v1/requests/{late}/reply/", {"payload": {"rps": 1200}}).ok(200)
    late_item = tester.steering_item(tester_cursor, lambda i: i["request_id"] == late)
    assert (late_item["kind"], late_item["status"], late_item["payload"]) == ("response", "completed", {"rps": 1200})

    # The request's state, for its sender and for a manager alike.
    detail = tester.get(f"/api/v1/requests/{rid}/").ok(200)
    assert detail == owner.get(f"/api/v1/requests/{rid}/").ok(200)
    assert {
        k: detail[k] for k in ("request_id", "from", "to", "type", "payload", "mode", "status", "reply", "error")
    } == {
        "request_id": rid,
        "from": "agent:tester-01",
        "to": "agent:coder-01",
        "type": "compatibility.check",
        "payload": {"api_change": "rename /users"},
        "mode": "async",
        "status": "completed",
        "reply": reply,
        "error": None,
    }
    assert detail["created_at"] and detail["updated_at"]

    # Cancel: idempotent for the sender; the recipient gets a notice and can no longer reply.
    withdrawn = tester.post(f"{base}/requests/", {"to": "agent:coder-01", "type": "perf.check", "payload": {}}).ok(202)
    wid = withdrawn["request_id"]
    assert tester.post(f"/api/v1/requests/{wid}/cancel/").ok(200) == {"request_id": wid, "status": "cancelled"}
    assert tester.post(f"/api/v1/requests/{wid}/cancel/").ok(200) == {"request_id": wid, "status": "cancelled"}
    notice = coder.steering_item(coder_cursor, lambda i: i["request_id"] == wid and i["kind"] == "notice")
    assert (notice["from"], notice["status"]) == ("agent:tester-01", "cancelled")
    coder.post(f"/api/v1/requests/{wid}/reply/", {"payload": {}}).problem(409, "request_cancelled")

    # Finishing the coder's run: its pending requests become recipient_unavailable, each sender is told.
    stranded = tester.post(f"{base}/requests/", {"to": "agent:coder-01", "type": "doc.review", "payload": {}}).ok(202)
    sid = stranded["request_id"]
    run_id = coder_card["run_id"]
    assert coder.post(f"/api/v1/runs/{run_id}/status/", {"status": "finished"}).ok(200) == {
        "run_id": run_id,
        "status": "completed",
        "worker": "",  # an external agent's run: no worker of Agora's runs it
    }
    unavailable = tester.get(f"/api/v1/requests/{sid}/").ok(200)
    assert (unavailable["status"], unavailable["error"]["code"]) == ("recipient_unavailable", "recipient_unavailable")
    gone = tester.steering_item(tester_cursor, lambda i: i["request_id"] == sid)
    assert (gone["kind"], gone["from"], gone["status"]) == ("notice", "agent:coder-01", "recipient_unavailable")
    tester.post(f"{base}/requests/", {"to": "agent:coder-01", "type": "x", "payload": {}}).problem(
        409, "recipient_unavailable"
    )

    # The journal tells all of it, in order, with its actors; and it pages by cursor.
    events: list[dict[str, Any]] = owner.get(f"{base}/journal/?after=0").ok(200)["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(set(e) >= {"seq", "type", "actor", "data", "created_at"} for e in events)
    happened = [(e["type"], e["actor"], e["data"].get("request_id")) for e in events]
    for step in [
        ("saga.created", "human:alice", None),
        ("request.created", "agent:tester-01", rid),
        ("request.delivered", "agent:coder-01", rid),
        ("request.completed", "agent:coder-01", rid),
        ("request.wait_timed_out", "agent:tester-01", late),
        ("request.cancelled", "agent:tester-01", wid),
        ("request.recipient_unavailable", "agent:coder-01", sid),
        ("run.completed", "agent:coder-01", None),
    ]:
        assert step in happened, step
    assert happened.index(("request.created", "agent:tester-01", rid)) < happened.index(
        ("request.completed", "agent:coder-01", rid)
    )
    page = owner.get(f"{base}/journal/?after=3&limit=2").ok(200)["events"]
    assert [e["seq"] for e in page] == [4, 5]
    assert tester.get(f"{base}/journal/").ok(200)["events"] == events
