"""Tokens, sagas, collaborators, steering messages, the journal, authentication and the OpenAPI
document, through DRF's APIClient."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.response import Response
from rest_framework.test import APIClient

from accounts.actions import create_agent_user
from accounts.models import ApiToken, User
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.models import Collaborator, Saga, SteeringItem
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team, journal, last_seq, profile_named, run_concurrently

pytestmark = pytest.mark.usefixtures("fast_passwords")


def test_a_person_trades_a_password_for_a_token(alice: User) -> None:
    anonymous = APIClient()
    issued = anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": "alice-password"}, format="json")
    assert issued.status_code == 200 and set(issued.data) == {"token"}
    assert issued.data["token"].startswith("usr_")
    assert ApiToken.objects.filter(user=alice).count() == 1  # stored hashed, never in clear
    assert not ApiToken.objects.filter(key_hash=issued.data["token"]).exists()
    me = APIClient()
    me.credentials(HTTP_AUTHORIZATION=f"Token {issued.data['token']}")
    assert me.get("/api/v1/sagas/").status_code == 200

    wrong = anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": "nope"}, format="json")
    unknown = anonymous.post("/api/v1/auth/token/", {"username": "nobody", "password": "nope"}, format="json")
    assert problem(wrong, 400, "invalid_credentials") == problem(unknown, 400, "invalid_credentials")
    problem(anonymous.post("/api/v1/auth/token/", {"username": "alice"}, format="json"), 400, "invalid_payload")


@pytest.fixture
def fresh_throttle() -> Iterator[None]:
    """Login attempts are counted in the default cache, per client address: start and end at zero."""
    cache.clear()
    yield
    cache.clear()


def test_password_guessing_is_throttled(alice: User, fresh_throttle: None, settings: LazySettings) -> None:
    """One account takes 10 attempts (tests/accounts/test_throttles.py covers the rates per address
    and per account); over a day-long window, so that none rolls over during the test."""
    settings.AGORA_SIGNIN_RATE_PER_ACCOUNT = "10/d"
    anonymous = APIClient()
    guesses = [
        anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": f"guess-{n}"}, format="json")
        for n in range(11)
    ]
    assert [g.status_code for g in guesses[:10]] == [400] * 10
    problem(guesses[10], 429, "throttled")
    assert int(guesses[10]["Retry-After"]) > 0
    # The right password does not get through either until the window passes.
    right = anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": "alice-password"}, format="json")
    problem(right, 429, "throttled")
    assert not ApiToken.objects.exists()


def test_agents_never_log_in(db: None) -> None:
    agent = create_agent_user(username="agent.x.coder")
    agent.set_password("guessable-password")  # even if a service user somehow had a password
    agent.save()
    refused = APIClient().post(
        "/api/v1/auth/token/", {"username": "agent.x.coder", "password": "guessable-password"}, format="json"
    )
    problem(refused, 400, "invalid_credentials")
    assert not ApiToken.objects.filter(user=agent).exists()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/sagas/"),
        ("post", "/api/v1/sagas/"),
        ("get", "/api/v1/sagas/00000000-0000-4000-8000-000000000000/"),
        ("get", "/api/v1/sagas/00000000-0000-4000-8000-000000000000/collaborators/"),
        ("post", "/api/v1/sagas/00000000-0000-4000-8000-000000000000/requests/"),
        ("get", "/api/v1/sagas/00000000-0000-4000-8000-000000000000/journal/"),
        ("get", "/api/v1/requests/req-1/"),
        ("post", "/api/v1/requests/req-1/reply/"),
        ("get", "/api/v1/steering/?wait=5"),
        ("post", "/api/v1/runs/run-1/status/"),
        ("get", "/api/v1/human-requests/"),
        ("post", "/api/v1/human-requests/hreq-1/answer/"),
        ("get", "/api/v1/no-such-endpoint/"),
    ],
)
def test_every_endpoint_requires_authentication(db: None, method: str, path: str) -> None:
    challenges = {"": "Token", "Token not-a-real-token": "Token", "Bearer agt_not-a-real-one": 'Bearer realm="agora"'}
    for header, challenge in challenges.items():  # the challenge is in the scheme the client used
        client = token_client(header) if header else APIClient()
        response = client.get(path) if method == "get" else client.post(path, {}, format="json")
        assert response.status_code == 401, response.content
        assert response["Content-Type"].startswith("application/problem+json")
        assert response.json()["code"] in ("not_authenticated", "authentication_failed")
        assert response["WWW-Authenticate"] == challenge


def token_client(header: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=header)
    return api


def test_sagas_are_created_by_people_and_listed_for_who_may_see_them(alice: User, mallory: User) -> None:
    created = client_for(alice).post(
        "/api/v1/sagas/", {"title": "API v2", "goal": "ship v2", "policy": "open"}, format="json"
    )
    assert created.status_code == 201
    saga = created.data
    assert {k: saga[k] for k in ("title", "goal", "policy", "status", "owner")} == {
        "title": "API v2",
        "goal": "ship v2",
        "policy": "open",
        "status": "open",
        "owner": "human:alice",
    }
    assert [s["id"] for s in client_for(alice).get("/api/v1/sagas/").data["sagas"]] == [saga["id"]]
    assert client_for(alice).get(f"/api/v1/sagas/{saga['id']}/").data == saga
    assert client_for(mallory).get("/api/v1/sagas/").data == {"sagas": []}
    problem(client_for(mallory).get(f"/api/v1/sagas/{saga['id']}/"), 404, "not_found")
    problem(client_for(mallory).get("/api/v1/sagas/not-a-uuid/"), 404, "not_found")
    body = problem(
        client_for(alice).post("/api/v1/sagas/", {"title": "", "policy": "mesh"}, format="json"), 400, "invalid_payload"
    )
    assert set(body["errors"]) == {"title", "policy"}


def test_a_retried_create_with_its_idempotency_key_returns_the_first_saga(alice: User, bob: User) -> None:
    body = {"title": "API v2", "goal": "ship v2"}
    first = client_for(alice).post("/api/v1/sagas/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = client_for(alice).post("/api/v1/sagas/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert (first.status_code, again.status_code, again.data) == (201, 200, first.data)
    assert ("Idempotent-Replayed" not in first.headers, again.headers["Idempotent-Replayed"]) == (True, "true")
    assert first.headers["Location"] == again.headers["Location"] == f"/api/v1/sagas/{first.data['id']}/"
    other = client_for(alice).post("/api/v1/sagas/", {"title": "Else"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    problem(other, 409, "idempotency_conflict")
    theirs = client_for(bob).post("/api/v1/sagas/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert theirs.status_code == 201 and theirs.data["id"] != first.data["id"]  # a key is its owner's
    unkeyed = [client_for(alice).post("/api/v1/sagas/", body, format="json").status_code for _ in range(2)]
    assert unkeyed == [201, 201]
    long = client_for(alice).post("/api/v1/sagas/", body, format="json", HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert "Idempotency-Key" in problem(long, 400, "invalid_payload")["errors"]
    assert Saga.objects.filter(owner=alice).count() == 3
    assert JournalEvent.objects.filter(saga_id=first.data["id"], type="saga.created").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_retries_at_once_create_one_saga(alice: User) -> None:
    def create() -> tuple[str, bool]:
        saga, created = actions.create_saga_once(title="Once", owner=alice, idempotency_key="same")
        return str(saga.pk), created

    outcomes = sorted(future.result() for future in run_concurrently(create, create, create))
    assert [created for _, created in outcomes] == [False, False, True]
    assert len({saga_id for saga_id, _ in outcomes}) == 1 == Saga.objects.filter(owner=alice).count()


def test_collaborators_join_and_are_discovered_as_the_caller_sees_them(team: Team, alice: User) -> None:
    base = f"/api/v1/sagas/{team.saga.pk}"
    owner = client_for(alice)
    added = owner.post(
        f"{base}/collaborators/",
        {"kind": "agent", "name": "ext", "role": "Integrator", "task": "Call us", "parent": "agent:lead"},
        format="json",
    )
    assert added.status_code == 201
    card = added.data
    token = card.pop("token")
    assert token.startswith("agt_")
    run_id = Collaborator.objects.get(saga=team.saga, name="ext").run.pk
    assert card == {"id": "agent:ext", "kind": "agent", "role": "Integrator", "task": "Call us", "status": "idle",
                    "run_id": run_id}  # fmt: skip

    # The new agent (a delegate of lead) sees its delegator, its siblings under the tree policy,
    # itself and the people; never the scout, lead's sibling's subtree included.
    ext = token_client(f"Bearer {token}")
    seen = ext.get(f"{base}/collaborators/").data["collaborators"]
    assert [c["id"] for c in seen] == [
        "human:alice", "human:bob", "agent:lead", "agent:coder", "agent:reviewer", "agent:ext",
    ]  # fmt: skip
    assert all("token" not in c and "username" not in c and "email" not in c for c in seen)
    # People see everyone.
    everyone = owner.get(f"{base}/collaborators/").data["collaborators"]
    assert {c["id"] for c in everyone} >= {"agent:scout", "agent:tester", "agent:ext"}
    assert all(("run_id" in c) == (c["kind"] == "agent") for c in everyone)

    # An agent adds only its own delegates; people add people.
    mine = ext.post(
        f"{base}/collaborators/", {"kind": "agent", "name": "ext-helper", "parent": "agent:ext"}, format="json"
    )
    assert mine.status_code == 201 and mine.data["id"] == "agent:ext-helper"
    not_mine = {"kind": "agent", "name": "mole", "parent": "agent:lead"}
    problem(ext.post(f"{base}/collaborators/", not_mine, format="json"), 403, "forbidden")
    problem(ext.post(f"{base}/collaborators/", {"kind": "human", "username": "alice"}, format="json"), 403, "forbidden")
    problem(owner.post(f"{base}/collaborators/", {"kind": "agent", "name": "ext"}, format="json"), 409, "name_taken")
    problem(owner.post(f"{base}/collaborators/", {"kind": "robot"}, format="json"), 400, "invalid_payload")
    nobody = owner.post(f"{base}/collaborators/", {"kind": "human", "username": "nobody"}, format="json")
    assert problem(nobody, 404, "not_found")["errors"] == {"username": ["No such person."]}
    # The token is in the response that created the agent, and nowhere else.
    assert token not in json.dumps(owner.get(f"{base}/collaborators/").data)


def test_an_agent_whose_run_has_ended_delegates_no_more(team: Team, alice: User) -> None:
    """No one hands work to a finished agent's delegates: it adds none itself, and no manager adds
    one under it (`invalid_state`, as for its asks); nothing is written."""
    base = f"/api/v1/sagas/{team.saga.pk}"
    coder = client_for(team.user("coder"), "Bearer")
    finished = coder.post(f"/api/v1/runs/{team.run('coder').pk}/status/", {"status": "finished"}, format="json")
    assert (finished.status_code, finished.data["status"]) == (200, "completed")
    mark = last_seq(team.saga)
    helper = {"kind": "agent", "name": "helper", "role": "R", "task": "t", "runtime": "external"}

    refused = problem(coder.post(f"{base}/collaborators/", helper, format="json"), 409, "invalid_state")
    assert refused["detail"] == "agent:coder has ended (completed): it delegates no more."
    under = helper | {"parent": "agent:coder"}
    problem(client_for(alice).post(f"{base}/collaborators/", under, format="json"), 409, "invalid_state")
    many = [actions.NewAgent(name=n, role="R", task="t", runtime="external") for n in ("h1", "h2")]
    with pytest.raises(errors.InvalidState):
        actions.add_agents(saga=team.saga, agents=many, by=team.user("coder"), parent="agent:coder")

    assert not team.saga.collaborators.filter(name__in=["helper", "h1", "h2"]).exists()
    assert journal(team.saga, after=mark) == []
    # Elsewhere in the tree work goes on.
    added = client_for(alice).post(f"{base}/collaborators/", helper | {"parent": "agent:lead"}, format="json")
    assert added.status_code == 201 and team.saga.collaborators.filter(name="helper").exists()


def test_people_join_with_a_role(team: Team, alice: User, mallory: User) -> None:
    base = f"/api/v1/sagas/{team.saga.pk}"
    joined = client_for(alice).post(
        f"{base}/collaborators/",
        {"kind": "human", "username": "mallory", "role": "Auditor", "task": "Audit"},
        format="json",
    )
    assert (joined.status_code, joined.data) == (
        201,
        {"id": "human:mallory", "kind": "human", "role": "Auditor", "task": "Audit"},
    )
    assert client_for(mallory).get(f"{base}/").status_code == 200  # she may see the saga now


def test_a_retried_add_with_its_idempotency_key_returns_the_first_collaborator(
    team: Team, alice: User, mallory: User
) -> None:
    """A replay returns the first collaborator (200, `Idempotent-Replayed`), an external agent
    without a token: its one token, in the first answer, still works, and nothing rotated it.
    Another body is a conflict; a key is its caller's."""
    base, owner = f"/api/v1/sagas/{team.saga.pk}", client_for(alice)
    ext = {"kind": "agent", "name": "ext", "role": "Integrator", "task": "Call us", "runtime": "external"}
    first = owner.post(f"{base}/collaborators/", ext, format="json", HTTP_IDEMPOTENCY_KEY="add-1")
    again = owner.post(f"{base}/collaborators/", ext, format="json", HTTP_IDEMPOTENCY_KEY="add-1")
    assert (first.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (201, 200, "true")
    token = first.data.pop("token")
    assert again.data == first.data  # the same card, and no token
    assert token_client(f"Bearer {token}").get(f"{base}/collaborators/").status_code == 200
    assert Collaborator.objects.filter(saga=team.saga, name="ext").count() == 1
    events = JournalEvent.objects.filter(saga=team.saga, data__id="agent:ext").order_by("seq")
    assert [(e.type, e.actor) for e in events] == [("collaborator.joined", "human:alice")]
    other = owner.post(f"{base}/collaborators/", ext | {"task": "Else"}, format="json", HTTP_IDEMPOTENCY_KEY="add-1")
    problem(other, 409, "idempotency_conflict")

    mine = {"kind": "agent", "name": "ext-helper", "parent": "agent:ext", "runtime": "external"}
    as_ext = token_client(f"Bearer {token}")  # the same key, another caller: its own
    assert as_ext.post(f"{base}/collaborators/", mine, format="json", HTTP_IDEMPOTENCY_KEY="add-1").status_code == 201

    inside = {"kind": "agent", "name": "worker", "runtime": "internal", "profile": profile_named("worker"),
              "parent": "agent:lead"}  # fmt: skip
    person = {"kind": "human", "username": "mallory", "role": "Auditor"}
    for body, key in ((inside, "add-2"), (person, "add-3")):
        answers = [owner.post(f"{base}/collaborators/", body, format="json", HTTP_IDEMPOTENCY_KEY=key) for _ in "12"]
        assert [a.status_code for a in answers] == [201, 200] and answers[0].data == answers[1].data
    assert team.saga.collaborators.filter(name__in=["worker", "mallory"]).count() == 2
    assert Collaborator.objects.get(saga=team.saga, name="worker").run.turn <= 1  # queued once, not twice

    # Once the saga is finished, a replay still answers with what the first add made, as it is now.
    actions.finish_saga(saga=team.saga, status="cancelled", by=alice)
    late = owner.post(f"{base}/collaborators/", inside, format="json", HTTP_IDEMPOTENCY_KEY="add-2")
    assert (late.status_code, late.data["id"], late.data["status"]) == (200, "agent:worker", "cancelled")


@pytest.mark.django_db(transaction=True)
def test_two_retries_at_once_add_one_collaborator(team: Team, alice: User) -> None:
    def add() -> tuple[int, bool]:
        new = actions.NewAgent(name="ext", role="R", task="t", runtime="external")
        agent, _, created = actions.add_agent_once(saga=team.saga, agent=new, by=alice, idempotency_key="same")
        return agent.pk, created

    outcomes = sorted(future.result() for future in run_concurrently(add, add, add))
    assert [created for _, created in outcomes] == [False, False, True]
    assert len({pk for pk, _ in outcomes}) == 1 == team.saga.collaborators.filter(name="ext").count()


def test_managers_steer_agents(team: Team, alice: User, bob: User) -> None:
    base = f"/api/v1/sagas/{team.saga.pk}"
    steered = client_for(alice).post(
        f"{base}/collaborators/agent:coder/steer/", {"message": "Prioritise the auth endpoints."}, format="json"
    )
    assert steered.status_code == 201 and steered.data["to"] == "agent:coder"
    [item] = client_for(team.user("coder"), "Bearer").get("/api/v1/steering/?after=0").data["items"]
    assert (item["seq"], item["kind"], item["from"], item["payload"]) == (
        steered.data["seq"],
        "message",
        "human:alice",
        "Prioritise the auth endpoints.",
    )
    assert item["request_id"] is None and "status" not in item
    problem(
        client_for(bob).post(f"{base}/collaborators/agent:coder/steer/", {"message": "x"}, format="json"),
        403,
        "forbidden",
    )
    problem(
        client_for(alice).post(f"{base}/collaborators/agent:ghost/steer/", {"message": "x"}, format="json"),
        404,
        "not_found",
    )
    problem(
        client_for(alice).post(f"{base}/collaborators/human:bob/steer/", {"message": "x"}, format="json"),
        400,
        "invalid_payload",
    )
    assert SteeringItem.objects.filter(kind="message").count() == 1


def test_a_retried_steer_is_delivered_once(team: Team, alice: User) -> None:
    path = f"/api/v1/sagas/{team.saga.pk}/collaborators/agent:coder/steer/"
    alice_api = client_for(alice)

    def send(message: str, key: str) -> Response:
        return alice_api.post(path, {"message": message}, format="json", HTTP_IDEMPOTENCY_KEY=key)

    first = send("Ship it.", "steer-1")
    again = send("Ship it.", "steer-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.data == first.data and again["Idempotent-Replayed"] == "true"
    problem(send("Do not ship.", "steer-1"), 409, "idempotency_conflict")
    assert send("Ship it.", "steer-2").status_code == 201  # another key: another message
    assert client_for(alice).post(path, {"message": "Ship it."}, format="json").status_code == 201  # no key: each time
    items = list(SteeringItem.objects.filter(kind="message").order_by("seq"))
    assert [(i.payload, i.idempotency_key) for i in items] == [("Ship it.", "steer-1"), ("Ship it.", "steer-2"),
                                                               ("Ship it.", "")]  # fmt: skip
    assert JournalEvent.objects.filter(saga=team.saga, type="steering.message").count() == 3


def test_the_steering_cursor_acknowledges_and_pages(team: Team, alice: User) -> None:
    lead, coder = client_for(team.user("lead"), "Bearer"), client_for(team.user("coder"), "Bearer")
    path = f"/api/v1/sagas/{team.saga.pk}/requests/"
    rids = [
        lead.post(path, {"to": "agent:coder", "type": f"t{n}", "payload": n}, format="json").data["request_id"]
        for n in range(3)
    ]
    items = coder.get("/api/v1/steering/?after=0").data["items"]
    assert [i["request_id"] for i in items] == rids
    # after=N consumes up to N (those requests become delivered) and returns what follows.
    rest = coder.get(f"/api/v1/steering/?after={items[1]['seq']}").data["items"]
    assert [i["request_id"] for i in rest] == rids[2:]
    assert [lead.get(f"/api/v1/requests/{rid}/").data["status"] for rid in rids] == [
        "delivered",
        "delivered",
        "pending",
    ]
    problem(coder.get("/api/v1/steering/?after=-1"), 400, "invalid_payload")
    problem(coder.get("/api/v1/steering/?wait=soon"), 400, "invalid_payload")
    problem(client_for(alice).get("/api/v1/steering/"), 403, "forbidden")


def test_external_runs_report_their_status(team: Team, alice: User) -> None:
    coder = client_for(team.user("coder"), "Bearer")
    run_id = team.run("coder").pk
    working = coder.post(f"/api/v1/runs/{run_id}/status/", {"status": "working"}, format="json")
    assert (working.status_code, working.data) == (200, {"run_id": run_id, "status": "running", "worker": ""})
    problem(coder.post(f"/api/v1/runs/{run_id}/status/", {"status": "asleep"}, format="json"), 400, "invalid_payload")
    problem(
        coder.post(f"/api/v1/runs/{team.run('lead').pk}/status/", {"status": "idle"}, format="json"), 404, "not_found"
    )
    problem(
        client_for(alice).post(f"/api/v1/runs/{run_id}/status/", {"status": "idle"}, format="json"), 404, "not_found"
    )


def test_the_journal_pages_after_a_cursor(team: Team, alice: User, mallory: User) -> None:
    base = f"/api/v1/sagas/{team.saga.pk}/journal/"
    events = client_for(alice).get(base).data["events"]
    stored = list(JournalEvent.objects.for_saga(team.saga.pk).values_list("seq", "type", "actor"))
    assert [(e["seq"], e["type"], e["actor"]) for e in events] == stored
    assert events[0]["type"] == "saga.created" and events[0]["actor"] == "human:alice"
    page = client_for(alice).get(f"{base}?after=2&limit=3").data["events"]
    assert [e["seq"] for e in page] == [3, 4, 5]
    # tester does not see scout (neither its lineage nor, under `tree`, its sibling): its page of
    # three skips scout's join.
    seen = client_for(team.user("tester"), "Bearer").get(f"{base}?after=2&limit=3").data["events"]
    joined = [e["data"]["id"] for e in events if e["type"] == "collaborator.joined"]
    assert [e["data"]["id"] for e in seen] == [h for h in joined[1:] if h != "agent:scout"][:3]
    problem(client_for(alice).get(f"{base}?limit=0"), 400, "invalid_payload")
    problem(client_for(mallory).get(base), 404, "not_found")


def test_the_openapi_document_and_its_docs(alice: User, tmp_path: Path) -> None:
    schema = client_for(alice).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    for path in (
        "/api/v1/auth/token/",
        "/api/v1/sagas/{saga_id}/requests/",
        "/api/v1/steering/",
        "/api/v1/requests/{request_id}/reply/",
        "/api/v1/human-requests/{human_request_id}/answer/",
        "/api/v1/sagas/{saga_id}/journal/",
        "/api/v1/sagas/{saga_id}/prompts/",
        "/api/v1/prompts/{prompt_id}/",
    ):
        assert path in paths, path
    assert set(paths["/api/v1/sagas/{saga_id}/requests/"]["post"]["responses"]) >= {"200", "202", "409", "413"}
    assert client_for(alice).get("/api/v1/docs/").status_code == 200
    # The document is valid OpenAPI and its generation raises no warning.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
