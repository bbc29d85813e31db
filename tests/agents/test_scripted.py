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
