"""The runtime over the fake model server, with a real Celery worker and Redis."""

import json
from typing import Any

import pytest
from django.db import connection

from journal.models import JournalEvent
from sagas.models import Collaborator, Run, Saga
from tests.agents.fake_llm import (
    GATE,
    HANG,
    MALFORMED,
    RATE_LIMIT,
    SERVER_ERROR,
    FakeLLM,
    finish_once_answered,
    say,
    tool_call,
)
from tests.sagas.kernel import AddAgent, events_of, finished
from tests.support import CeleryWorker, wait_until


def run_of(collaborator: Collaborator) -> Run:
    return Run.objects.get(collaborator=collaborator)


def tool_result(request: dict[str, Any], call_id: str) -> Any:
    """The result the model was shown for one of its tool calls."""
    message = next(m for m in request["messages"] if m["role"] == "tool" and m["tool_call_id"] == call_id)
    return json.loads(message["content"])


def test_wait_mode_returns_the_reply_as_the_tool_result(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    add_internal("echo", model="scripted:responder")
    fake_llm.script(
        "model-a",
        say("", tool_call("get_collaborators", {}, "c1")),
        say(
            "",
            tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": {"n": 1}, "mode": "wait"}, "c2"),
        ),
        say("", tool_call("finish", {"result": "done"}, "c3")),
    )
    ann = add_internal("ann", model="model-a")

    run = wait_until(lambda: finished(ann), what="ann's run to finish")

    assert run.status == Run.Status.COMPLETED and run.result == "done"
    _, second, third = fake_llm.calls_for("model-a")
    assert {"id": "agent:echo", "kind": "agent", "role": "Echo", "task": "echo's task"}.items() <= next(
        c for c in tool_result(second, "c1")["collaborators"] if c["id"] == "agent:echo"
    ).items()
    result = tool_result(third, "c2")
    assert result == {
        "request_id": result["request_id"],
        "status": "completed",
        "from": "agent:echo",
        "payload": {"echo": {"n": 1}},
    }
    # The reply was the tool result, so it is not shown again as a steering message.
    assert not any(result["request_id"] in str(m.get("content")) for m in third["messages"] if m["role"] == "user")
    assert [e.data["status"] for e in events_of(saga, "worker_end")] == ["completed"]


def test_async_mode_delivers_the_reply_in_a_later_turn(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent
) -> None:
    add_internal("echo", model="scripted:responder")
    fake_llm.script(
        "model-a", say("", tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": [1, 2]}, "c1"))
    )
    # Then: carry on (no tool call) until the reply shows up in the conversation, and finish.
    fake_llm.rule("model-a", finish_once_answered("got it", "c2", meanwhile="I will wait for the answer."))
    ann = add_internal("ann", model="model-a")

    wait_until(lambda: finished(ann), what="ann's run to finish")

    calls = fake_llm.calls_for("model-a")
    second, last = calls[1], calls[-1]
    pending = tool_result(second, "c1")
    assert pending == {"request_id": pending["request_id"], "status": "pending"}
    # The ask returned at once; the reply came as a steering message of a later turn.
    steering = last["messages"][-1]
    assert steering["role"] == "user"
    assert f'kind="response" from="agent:echo" request_id="{pending["request_id"]}"' in steering["content"]
    assert 'status="completed"' in steering["content"] and '{"echo": [1, 2]}' in steering["content"]


def test_a_failing_model_falls_back_to_the_next_and_each_failure_is_journaled(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    fake_llm.script("m-500", SERVER_ERROR)
    fake_llm.script("m-hang", HANG)
    fake_llm.script("m-ok", say("", tool_call("finish", {"result": "ok"}, "c1")))
    ann = add_internal("ann", model="m-500", fallback=["m-hang", "m-ok"])

    run = wait_until(lambda: finished(ann), timeout=30, what="ann's run to finish")

    assert run.status == Run.Status.COMPLETED
    fallbacks = [(e.data["role"], e.data["model"], e.data["error_class"]) for e in events_of(saga, "model_fallback")]
    assert fallbacks == [("Ann", "m-500", "InternalServerError"), ("Ann", "m-hang", "APITimeoutError")]
    assert [e.data["model"] for e in events_of(saga, "llm_call")] == ["m-ok"]


def test_when_every_candidate_fails_the_run_ends_failed_not_crashed(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    fake_llm.script("m-500", SERVER_ERROR)
    fake_llm.script("m-429", RATE_LIMIT)
    fake_llm.script("m-bad", MALFORMED)
    ann = add_internal("ann", model="m-500", fallback=["m-429", "m-bad"])

    run = wait_until(lambda: finished(ann), what="ann's run to finish")

    assert run.status == Run.Status.FAILED
    assert run.error == "Every model candidate failed."
    assert [e.data["error_class"] for e in events_of(saga, "model_fallback")] == [
        "InternalServerError",
        "RateLimitError",
        "MalformedResponse",
    ]
    assert [(e.data["status"], e.data["error"]) for e in events_of(saga, "worker_end")] == [
        ("failed", "Every model candidate failed.")
    ]


def test_a_vision_run_skips_text_only_candidates_before_calling_them(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    fake_llm.script("seer", say("", tool_call("finish", {"result": "seen"}, "c1")))
    ann = add_internal(
        "ann", model="text-only", fallback=["seer"], requires=["vision"], model_capabilities={"seer": ["vision"]}
    )

    run = wait_until(lambda: finished(ann), what="ann's run to finish")

    assert run.status == Run.Status.COMPLETED
    assert fake_llm.calls_for("text-only") == []
    assert [e.data["model"] for e in events_of(saga, "model_skipped")] == ["text-only"]


def test_a_malformed_tool_call_gets_an_error_result_not_a_crash(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent
) -> None:
    fake_llm.script(
        "model-a",
        say("", tool_call("ask_agent", "{not json", "bad1"), tool_call("launch_missiles", {}, "bad2")),
        say("", tool_call("ask_agent", {"to": "agent:nobody", "type": "x", "payload": {}, "colour": "red"}, "bad3")),
        say("", tool_call("finish", {"result": "recovered"}, "c1")),
    )
    ann = add_internal("ann", model="model-a")

    run = wait_until(lambda: finished(ann), what="ann's run to finish")

    assert run.status == Run.Status.COMPLETED and run.result == "recovered"
    _, second, third = fake_llm.calls_for("model-a")
    assert tool_result(second, "bad1")["error"]["code"] == "invalid_arguments"
    assert tool_result(second, "bad2")["error"]["code"] == "unknown_tool"
    assert tool_result(third, "bad3")["error"] == {"code": "invalid_arguments", "message": "Unknown arguments: colour."}


@pytest.mark.parametrize("asks", [1])
def test_a_worker_killed_during_a_model_call_is_recovered_without_duplicate_effects(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga, asks: int
) -> None:
    from sagas.models import AgentRequest, SteeringItem
    from sagas.tasks import reconcile

    echo = add_internal("echo", model="scripted:responder")
    fake_llm.script(
        "model-a",
        say("", tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": {"n": 1}}, "c1")),
        HANG,  # the second model call is where the worker dies
        say(
            "",
            tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": {"n": 2}, "mode": "wait"}, "c2"),
        ),
        say("", tool_call("finish", {"result": "survived"}, "c3")),
    )
    ann = add_internal("ann", model="model-a")
    wait_until(lambda: len(fake_llm.calls_for("model-a")) == 2, what="the second model call to start")

    worker.kill()
    worker.start()

    def recovered() -> Run | None:
        reconcile()  # what beat does every few seconds: the expired lease is reclaimed
        return finished(ann)

    run = wait_until(recovered, timeout=60, interval=0.5, what="ann's run to recover and finish")

    assert run.status == Run.Status.COMPLETED and run.result == "survived"
    sent = AgentRequest.objects.filter(sender=ann).order_by("created_at")
    assert [r.payload for r in sent] == [{"n": 1}, {"n": 2}]
    assert all(r.status == AgentRequest.Status.COMPLETED for r in sent)
    for request in sent:
        assert SteeringItem.objects.filter(request=request, recipient=echo, kind="request").count() == 1
        assert SteeringItem.objects.filter(request=request, recipient=ann, kind="response").count() == 1
    assert len(events_of(saga, "request.created")) == 2
    assert len(events_of(saga, "request.completed")) == 2
    # The turn the crash cut short was reclaimed (on a busy machine a later lease may lapse too).
    assert [e.data["turn"] for e in events_of(saga, "run.reclaimed")][:1] == [2]


def test_a_busy_recipient_gets_the_request_at_its_next_turn_not_during_the_current_one(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga, alice: Any
) -> None:
    from sagas import actions
    from sagas.models import SteeringItem

    caller, _ = actions.add_agent(saga=saga, name="caller", role="Caller", task="ask", runtime="external", by=alice)
    fake_llm.script("model-a", GATE, say("", tool_call("get_collaborators", {}, "c1")))
    fake_llm.rule("model-a", lambda body: say("Noted."))
    ann = add_internal("ann", model="model-a")
    wait_until(lambda: len(fake_llm.calls_for("model-a")) == 1, what="ann's first model call")

    request, _ = actions.ask_agent(sender=caller, to="agent:ann", type="status.check", payload={"q": "busy?"})
    fake_llm.gate.set()

    wait_until(lambda: run_of(ann).status == Run.Status.IDLE and len(fake_llm.calls_for("model-a")) >= 2)
    first, second = fake_llm.calls_for("model-a")[:2]
    assert request.pk not in json.dumps(first["messages"])
    assert f'request_id="{request.pk}"' in second["messages"][-1]["content"]
    item = SteeringItem.objects.get(request=request, kind="request")
    assert item.consumed_turn == 2
    types = [e.type for e in JournalEvent.objects.for_saga(saga.pk).filter(actor="agent:ann")]
    assert types.index("request.delivered") > types.index("llm_call")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs row locks: SQLite locks the whole database")
def test_a_worker_killed_during_tool_execution_is_recovered_without_duplicate_effects(
    worker: CeleryWorker, fake_llm: FakeLLM, add_internal: AddAgent, saga: Saga
) -> None:
    import threading

    from django.db import connections, transaction

    from agents.models import TranscriptEntry
    from sagas.models import AgentRequest
    from sagas.tasks import reconcile

    echo = add_internal("echo", model="scripted:responder")
    ask = say("", tool_call("ask_agent", {"to": "agent:echo", "type": "echo.me", "payload": {"n": 1}}, "c1"))
    # The killed turn's transaction rolls back whole, so its model call runs again and asks again.
    fake_llm.script("model-a", GATE, ask, ask)
    fake_llm.rule("model-a", finish_once_answered("survived", "c2", meanwhile="Waiting."))
    ann = add_internal("ann", model="model-a")
    wait_until(lambda: len(fake_llm.calls_for("model-a")) == 1, what="ann's first model call")

    # Hold the recipient's row so the ask blocks inside the transaction that stores the model's
    # message with its tool calls, then kill the worker right there.
    locked, done = threading.Event(), threading.Event()

    def hold_saga_lock() -> None:
        with transaction.atomic():
            Collaborator.objects.select_for_update().get(pk=echo.pk)
            locked.set()
            done.wait(60)
        connections.close_all()

    holder = threading.Thread(target=hold_saga_lock)
    holder.start()
    try:
        locked.wait(10)
        fake_llm.gate.set()
        with connection.cursor() as cursor:
            blocked = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            wait_until(lambda: cursor.execute(blocked) or cursor.fetchone()[0] > 0, what="the tool to block")
        worker.kill()
    finally:
        done.set()
        holder.join()
    worker.start()

    def recovered() -> Run | None:
        reconcile()
        return finished(ann)

    run = wait_until(recovered, timeout=60, interval=0.5, what="ann's run to recover and finish")

    assert run.status == Run.Status.COMPLETED
    sent = AgentRequest.objects.filter(sender=ann)
    assert [(r.payload, r.status) for r in sent] == [({"n": 1}, "completed")]
    assert len(events_of(saga, "request.created")) == 1
    assert TranscriptEntry.objects.filter(run=run, message__tool_call_id="c1").count() == 1
    # The killed turn's message went with its effects: the ask is stored once. (Whether a turn
    # waited before the reply came depends on timing.)
    said = [e.message for e in TranscriptEntry.objects.filter(run=run, message__role="assistant").order_by("seq")]
    calls = [c["id"] for m in said for c in m.get("tool_calls", [])]
    assert calls.count("c1") == 1 and calls[-1] == "c2"
