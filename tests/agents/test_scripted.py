"""The scripted provider on its own: a pure function of the conversation."""

import json
from typing import Any

import pytest

from agents import scripted
from agents.providers import ProviderError, ScriptedProvider


def steering(**attrs: str) -> dict[str, Any]:
    return {"role": "user", "content": scripted.header(**attrs) + "\n" + json.dumps({"n": 1})}


def test_it_replies_to_each_new_request_by_type_and_walks_its_steps_in_order() -> None:
    history = [
        {"role": "system", "content": "…"},
        steering(kind="request", **{"from": "agent:a"}, request_id="req-1", type="test.plan"),
    ]
    text, calls = scripted.next_move("demo-tester", history)

    planned = scripted.load_playbook("demo-tester")["replies"]["test.plan"]
    assert text == ""
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("reply-req-1", "reply", {"request_id": "req-1", "payload": planned}),
        ("step-0", "get_collaborators", {}),
    ]

    # After its single step, with nothing new to answer, it has nothing to do.
    history.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
    ]})  # fmt: skip
    assert scripted.next_move("demo-tester", history) == ("Nothing more to do for now.", [])


def test_the_same_conversation_gives_the_same_calls() -> None:
    history = [steering(kind="request", **{"from": "agent:a"}, request_id="req-9", type="anything")]
    assert scripted.next_move("responder", history) == scripted.next_move("responder", history)


def test_an_unknown_playbook_is_a_non_retryable_provider_error() -> None:
    with pytest.raises(ProviderError) as caught:
        ScriptedProvider().complete(model="scripted:../etc/passwd", messages=[], tools=[])
    assert (caught.value.retryable, caught.value.error_class) == (False, "UnknownPlaybook")


def said(kind: str, payload: Any, **attrs: str) -> dict[str, Any]:
    return {"role": "user", "content": scripted.header(kind=kind, **attrs) + "\n" + json.dumps(payload)}


def made(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
    ]}  # fmt: skip


def test_chat_asks_again_after_each_answer_or_follow_up_until_told_done() -> None:
    text = lambda t: {"parts": [{"text": t}]}  # noqa: E731
    history = [said("request", text("hi"), **{"from": "agent:c"}, request_id="req-1", type="a2a.message")]
    _, calls = scripted.next_move("chat", history)
    assert [(c["id"], json.loads(c["arguments"])["to"]) for c in calls] == [("ask-req-1", "agent:c")]
    history += [
        made(calls),
        {"role": "tool", "tool_call_id": "ask-req-1", "content": json.dumps({"request_id": "q-1"})},
    ]
    history.append(said("response", text("more"), **{"from": "agent:c"}, request_id="q-1", status="completed"))
    _, calls = scripted.next_move("chat", history)
    assert [c["id"] for c in calls] == ["ask-req-1.1"]
    assert json.loads(calls[0]["arguments"])["payload"]["task_id"] == "req-1"
    history.append(made(calls))
    # A follow-up about the request (no question open): asked again, numbered on.
    history.append(said("message", {"request_id": "req-1", "message": text("and this")}, **{"from": "agent:c"}))
    _, calls = scripted.next_move("chat", history)
    assert [c["id"] for c in calls] == ["ask-req-1.2"]
    history.append(made(calls))
    history.append(said("message", {"request_id": "req-1", "message": text("Done, bye")}, **{"from": "agent:c"}))
    _, calls = scripted.next_move("chat", history)
    assert [(c["id"], c["name"]) for c in calls] == [("reply-req-1", "reply")]
    # A follow-up about a request it never talked about is left alone.
    stray = said("message", {"request_id": "req-9", "message": text("hello")}, **{"from": "agent:c"})
    assert scripted.next_move("chat", [*history, made(calls), stray])[1] == []
