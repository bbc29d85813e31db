"""Input nested too deep, or holding text no database stores, is refused where it enters with a 400
`invalid_payload`, and nothing is written: REST bodies, query strings and paths, dashboard forms and
a model's tool arguments. (WebSocket messages: tests/journal/test_consumer.py.)"""

import json

import pytest
from django.test import Client

from accounts.models import User
from agents.providers import Completion
from agents.tools import Call, execute
from sagas.models import AgentRequest, Collaborator, Saga
from tests.sagas.api_http import client_for, problem
from tests.sagas.kernel import Team

pytestmark = pytest.mark.usefixtures("fast_passwords")

DEEP = "[" * 5000 + "]" * 5000


def ask_body(payload: str) -> str:
    """An ask_agent body around payload, written as JSON text (json.dumps cannot write these)."""
    return '{"to": "agent:coder", "type": "t", "payload": ' + payload + "}"


BODIES = {
    "arrays 5,000 deep": ask_body(DEEP),
    "a lone surrogate": '{"to": "agent:coder", "type": "t", "payload": "\\ud800"}',
    "a lone surrogate in a key": '{"to": "agent:coder", "type": "t", "payload": {"\\udc00": 1}}',
    "NUL": '{"to": "agent:coder", "type": "t", "payload": {"note": "a\\u0000b"}}',
    "65 levels": ask_body("[" * 65 + "]" * 65),
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_a_request_body_that_cannot_be_stored_is_refused(team: Team, body: str) -> None:
    api = client_for(team.user("tester"), "Bearer")
    response = api.post(f"/api/v1/sagas/{team.saga.pk}/requests/", body, content_type="application/json")
    problem(response, 400, "invalid_payload")
    assert not AgentRequest.objects.exists()


def test_a_body_nested_up_to_the_limit_is_accepted(team: Team) -> None:
    api = client_for(team.user("tester"), "Bearer")
    body = ask_body("[" * 63 + "]" * 63)
    assert api.post(f"/api/v1/sagas/{team.saga.pk}/requests/", body, content_type="application/json").status_code == 202


def test_sign_in_and_saga_creation_refuse_deep_bodies_too(alice: User) -> None:
    anonymous = Client()
    problem(anonymous.post("/api/v1/auth/token/", DEEP, content_type="application/json"), 400, "invalid_payload")
    body = '{"title": "t", "goal": "\\ud800", "policy": "tree"}'
    problem(client_for(alice).post("/api/v1/sagas/", body, content_type="application/json"), 400, "invalid_payload")
    assert not Saga.objects.exists()


def test_nul_in_a_query_string_or_path_is_refused(team: Team) -> None:
    api = client_for(team.user("tester"), "Bearer")
    problem(api.get(f"/api/v1/sagas/{team.saga.pk}/journal/?after=%00"), 400, "invalid_payload")
    problem(api.get("/api/v1/requests/a%00b/"), 400, "invalid_payload")


def test_a_dashboard_form_with_nul_is_refused_and_nothing_is_created(alice: User) -> None:
    browser = Client()
    browser.force_login(alice)
    response = browser.post("/sagas/new/", {"title": "Nul\x00", "goal": "g", "policy": "tree"})
    assert response.status_code == 400
    assert b"invalid_payload" in response.content
    assert not Saga.objects.exists()
    assert browser.post("/accounts/login/", {"username": "alice\x00", "password": "x"}).status_code == 400


TOOL_ARGUMENTS = {
    "a lone surrogate": json.dumps({"to": "agent:coder", "type": "t", "payload": "\ud800"}),
    "NUL": json.dumps({"to": "agent:coder", "type": "t", "payload": "\x00"}),
    "arrays 5,000 deep": ask_body(DEEP),
}


@pytest.mark.parametrize("arguments", TOOL_ARGUMENTS.values(), ids=TOOL_ARGUMENTS.keys())
def test_a_models_tool_call_with_unstorable_arguments_gets_a_tool_error(team: Team, arguments: str) -> None:
    tester = team["tester"]
    call = Call(run=team.run("tester"), collaborator=tester, turn=1, call_id="c1")
    outcome = execute(call, "ask_agent", arguments, ["ask_agent"])
    assert outcome.result is not None and outcome.result["error"]["code"] == "invalid_payload"
    assert not outcome.finished
    assert not AgentRequest.objects.exists()


def test_a_models_text_is_kept_with_unstorable_characters_replaced() -> None:
    completion = Completion(
        model="m", content="a\x00b\ud800", tool_calls=[{"id": "c\x00", "name": "finish", "arguments": "{}\udc00"}]
    )
    message = completion.as_message()
    assert message["content"] == "a\ufffdb\ufffd"
    assert message["tool_calls"][0]["id"] == "c\ufffd"
    json.dumps(message, ensure_ascii=False).encode()  # storable: no UnicodeEncodeError


HUGE = "1" + "0" * 400  # an integer no float holds
WRONG_ARGUMENTS = {
    "an address as a list": ("ask_agent", '{"to": ["agent:coder"], "type": "t", "payload": 1}', "invalid_arguments"),
    "an address as null": ("ask_agent", '{"to": null, "type": "t", "payload": 1}', "invalid_arguments"),
    "a mode not among its values": (
        "ask_agent", '{"to": "agent:coder", "type": "t", "payload": 1, "mode": "soon"}', "invalid_arguments"
    ),
    "a boolean for seconds": (
        "ask_agent", '{"to": "agent:coder", "type": "t", "payload": 1, "mode": "wait", "timeout_s": true}',
        "invalid_arguments",
    ),
    "seconds past any float": (
        "ask_agent", f'{{"to": "agent:coder", "type": "t", "payload": 1, "mode": "wait", "timeout_s": {HUGE}}}',
        "invalid_arguments",
    ),
    "NaN": ("ask_agent", '{"to": "agent:coder", "type": "t", "payload": NaN}', "invalid_arguments"),
    "a number read as infinity": ("finish", '{"result": 1e400}', "invalid_arguments"),
    "a request id as a list": ("reply", '{"request_id": []}', "invalid_arguments"),
    "a request id as a huge number": ("cancel_request", f'{{"request_id": {HUGE}}}', "invalid_arguments"),
    "a role as null": ("delegate", '{"name": "helper", "role": null, "task": "t"}', "invalid_arguments"),
    "a role past its column": ("delegate", json.dumps({"name": "helper", "role": "r" * 500, "task": "t"}),
                               "invalid_payload"),
    "a reason as an object": ("shutdown_teammate", '{"name": "coder", "reason": {"a": 1}}', "invalid_arguments"),
}  # fmt: skip


@pytest.mark.parametrize("tool, arguments, code", WRONG_ARGUMENTS.values(), ids=WRONG_ARGUMENTS.keys())
def test_a_models_tool_call_with_arguments_of_the_wrong_type_gets_a_tool_error(
    team: Team, tool: str, arguments: str, code: str
) -> None:
    """Not an exception out of the turn, which would roll it back whole (its model call and tokens
    with it) and give the model the same input again once the run's lease lapsed."""
    members = Collaborator.objects.count()
    call = Call(run=team.run("tester"), collaborator=team["tester"], turn=1, call_id="c1")

    outcome = execute(call, tool, arguments, [tool])

    assert outcome.result is not None and outcome.result["error"]["code"] == code, outcome.result
    assert not outcome.finished
    assert not AgentRequest.objects.exists() and Collaborator.objects.count() == members
