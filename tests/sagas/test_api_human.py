"""`ask_human` over the API: an agent's form, the addressed person's validated answer, delivered
once to the asking agent's steering."""

import pytest

from accounts.models import User
from sagas.models import HumanRequest, SteeringItem
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team

pytestmark = pytest.mark.usefixtures("fast_passwords")

FIELDS = [
    {"name": "approve", "label": "Approve the v2 plan?", "type": "boolean", "required": True},
    {"name": "budget", "label": "Budget (days)", "type": "integer", "required": True},
    {"name": "notes", "type": "text", "required": False},
]


def test_a_form_is_answered_once_and_the_answer_reaches_the_agent(
    team: Team, alice: User, bob: User, mallory: User
) -> None:
    coder = client_for(team.user("coder"), "Bearer")
    asked = coder.post(
        f"/api/v1/sagas/{team.saga.pk}/human-requests/",
        {"to": "human:bob", "title": "Sign off the plan", "fields": FIELDS, "from": "human:alice"},
        format="json",
        headers={"Idempotency-Key": "form-1"},
    )
    assert asked.status_code == 201
    hid = asked.data["human_request_id"]
    assert asked.headers["Location"] == f"/api/v1/human-requests/{hid}/"
    assert coder.get(asked.headers["Location"]).data["status"] == "pending"
    assert asked.data == {"human_request_id": hid, "status": "pending"}
    replayed = coder.post(
        f"/api/v1/sagas/{team.saga.pk}/human-requests/",
        {"to": "human:bob", "title": "Sign off the plan", "fields": FIELDS},
        format="json",
        headers={"Idempotency-Key": "form-1"},
    )
    assert (replayed.status_code, replayed.data["human_request_id"], replayed.headers["Idempotent-Replayed"]) == (
        200,
        hid,
        "true",
    )
    problem(
        coder.post(
            f"/api/v1/sagas/{team.saga.pk}/human-requests/",
            {"to": "human:bob", "title": "Sign off another plan", "fields": FIELDS},
            format="json",
            headers={"Idempotency-Key": "form-1"},
        ),
        409,
        "idempotency_conflict",
    )

    # Bob finds it among the forms addressed to him; alice (not addressed) does not.
    as_bob = client_for(bob)
    [listed] = as_bob.get("/api/v1/human-requests/?status=pending").data["human_requests"]
    assert {k: listed[k] for k in ("human_request_id", "from", "to", "title", "status", "answer")} == {
        "human_request_id": hid,
        "from": "agent:coder",
        "to": "human:bob",
        "title": "Sign off the plan",
        "status": "pending",
        "answer": None,
    }
    assert [f["name"] for f in listed["fields"]] == ["approve", "budget", "notes"]
    assert client_for(alice).get("/api/v1/human-requests/").data == {"human_requests": []}

    # Validation: a wrong type and a missing required field, each named.
    wrong = problem(
        as_bob.post(
            f"/api/v1/human-requests/{hid}/answer/", {"answer": {"approve": "maybe", "budget": "ten"}}, format="json"
        ),
        400,
        "invalid_payload",
    )
    assert set(wrong["errors"]) == {"approve", "budget"}
    missing = problem(
        as_bob.post(f"/api/v1/human-requests/{hid}/answer/", {"answer": {"approve": True}}, format="json"),
        400,
        "invalid_payload",
    )
    assert missing["errors"] == {"budget": ["This field is required."]}
    # Only the addressee answers; to an outsider the form does not exist.
    problem(
        client_for(alice).post(f"/api/v1/human-requests/{hid}/answer/", {"answer": {}}, format="json"), 403, "forbidden"
    )
    problem(
        client_for(mallory).post(f"/api/v1/human-requests/{hid}/answer/", {"answer": {}}, format="json"),
        404,
        "not_found",
    )
    problem(client_for(mallory).get(f"/api/v1/human-requests/{hid}/"), 404, "not_found")
    assert HumanRequest.objects.get(pk=hid).status == "pending"
    assert not SteeringItem.objects.filter(kind="human_response").exists()

    answered = as_bob.post(
        f"/api/v1/human-requests/{hid}/answer/", {"answer": {"approve": "yes", "budget": "12"}}, format="json"
    )
    assert answered.status_code == 200
    assert (answered.data["status"], answered.data["answer"]) == ("answered", {"approve": True, "budget": 12})
    again = as_bob.post(
        f"/api/v1/human-requests/{hid}/answer/", {"answer": {"approve": False, "budget": 1}}, format="json"
    )
    problem(again, 409, "already_answered")

    items = coder.get("/api/v1/steering/?after=0").data["items"]
    [delivered] = [item for item in items if item["kind"] == "human_response"]
    assert (delivered["request_id"], delivered["from"], delivered["payload"]) == (
        hid,
        "human:bob",
        {"approve": True, "budget": 12},
    )
    assert SteeringItem.objects.filter(kind="human_response", human_request_id=hid).count() == 1
    assert as_bob.get("/api/v1/human-requests/?status=pending").data == {"human_requests": []}
    assert coder.get(f"/api/v1/human-requests/{hid}/").data["answer"] == {"approve": True, "budget": 12}


def test_forms_go_to_the_owner_by_default_and_are_checked(team: Team, alice: User) -> None:
    coder = client_for(team.user("coder"), "Bearer")
    path = f"/api/v1/sagas/{team.saga.pk}/human-requests/"
    region = [{"name": "region", "type": "choice", "choices": ["eu", "us"]}]
    asked = coder.post(path, {"title": "Which region?", "fields": region}, format="json")
    assert asked.status_code == 201
    [listed] = client_for(alice).get("/api/v1/human-requests/").data["human_requests"]
    assert listed["human_request_id"] == asked.data["human_request_id"] and listed["to"] == "human:alice"

    problem(
        coder.post(path, {"title": "x", "fields": [{"name": "a", "type": "colour"}]}, format="json"),
        400,
        "invalid_payload",
    )
    problem(coder.post(path, {"title": "x", "fields": []}, format="json"), 400, "invalid_payload")
    optional = [{"name": "notes", "type": "text", "required": "false"}]  # a string would read as required
    problem(coder.post(path, {"title": "x", "fields": optional}, format="json"), 400, "invalid_payload")
    problem(coder.post(path, {"title": "x", "fields": FIELDS, "to": "agent:lead"}, format="json"), 404, "not_found")
    problem(client_for(alice).post(path, {"title": "x", "fields": FIELDS}, format="json"), 403, "forbidden")
    problem(client_for(alice).get("/api/v1/human-requests/?status=lost"), 400, "invalid_payload")
    assert HumanRequest.objects.count() == 1


def ask(team: Team, fields: list[dict[str, object]]) -> str:
    coder = client_for(team.user("coder"), "Bearer")
    asked = coder.post(f"/api/v1/sagas/{team.saga.pk}/human-requests/",
                       {"to": "human:bob", "title": "Q", "fields": fields}, format="json")  # fmt: skip
    assert asked.status_code == 201, asked.content
    return str(asked.data["human_request_id"])


def test_a_number_past_any_float_is_refused_as_no_number(team: Team, bob: User) -> None:
    hid = ask(team, [{"name": "budget", "type": "number"}])
    body = b'{"answer": {"budget": 1' + b"0" * 400 + b"}}"  # JSON has integers that big

    answered = client_for(bob).post(f"/api/v1/human-requests/{hid}/answer/", body, content_type="application/json")

    problem(answered, 400, "invalid_payload")
    assert answered.data["errors"] == {"budget": ["Enter a finite number."]}
    assert HumanRequest.objects.get(pk=hid).status == "pending"


def test_a_form_whose_asker_finished_is_withdrawn(team: Team, bob: User) -> None:
    """No answer would reach an agent whose run has ended: its forms leave the inbox, and an
    answer is refused as for a form its saga's end withdrew."""
    hid = ask(team, [{"name": "ok", "type": "boolean"}])
    coder = client_for(team.user("coder"), "Bearer")

    done = coder.post(f"/api/v1/runs/{team.run('coder').pk}/status/", {"status": "finished"}, format="json")

    assert done.status_code == 200, done.content
    assert HumanRequest.objects.get(pk=hid).status == "cancelled"
    as_bob = client_for(bob)
    assert as_bob.get("/api/v1/human-requests/?status=pending").data["human_requests"] == []
    problem(as_bob.post(f"/api/v1/human-requests/{hid}/answer/", {"answer": {"ok": True}}, format="json"), 409,
            "request_closed")  # fmt: skip
    assert SteeringItem.objects.filter(kind=SteeringItem.Kind.HUMAN_RESPONSE).count() == 0
    # Nor may it ask another.
    form = {"to": "human:bob", "title": "Q", "fields": [{"name": "ok", "type": "boolean"}]}
    again = coder.post(f"/api/v1/sagas/{team.saga.pk}/human-requests/", form, format="json")
    problem(again, 409, "invalid_state")
    assert HumanRequest.objects.count() == 1


@pytest.mark.parametrize("answer", [{"ok": True}, {}, {"ok": "maybe"}])
def test_a_closed_form_says_so_whatever_the_answer(team: Team, bob: User, answer: dict[str, object]) -> None:
    """A withdrawn form is `request_closed`, an answered one `already_answered`, before the answer
    is read: an answer that does not fit it names no fields of a form nobody may answer."""
    withdrawn, answered = ask(team, [{"name": "ok", "type": "boolean"}]), ask(team, [{"name": "ok", "type": "boolean"}])
    as_bob = client_for(bob)
    assert as_bob.post(f"/api/v1/human-requests/{answered}/answer/", {"answer": {"ok": False}},
                       format="json").status_code == 200  # fmt: skip
    coder = client_for(team.user("coder"), "Bearer")
    coder.post(f"/api/v1/runs/{team.run('coder').pk}/status/", {"status": "finished"}, format="json")  # withdraws
    assert HumanRequest.objects.get(pk=withdrawn).status == HumanRequest.Status.CANCELLED

    for hid, code in ((withdrawn, "request_closed"), (answered, "already_answered")):
        problem(as_bob.post(f"/api/v1/human-requests/{hid}/answer/", {"answer": answer}, format="json"), 409, code)
    assert HumanRequest.objects.get(pk=answered).answer == {"ok": False}
