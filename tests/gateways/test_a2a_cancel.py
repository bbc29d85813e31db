"""An A2A cancel cancels the task and declines the agent's open questions about it in one
transaction: a failure between them leaves both as they were, never a cancelled task whose
questions wait for an answer that cannot come."""

import pytest

from gateways.a2a import handler
from sagas import actions
from sagas.models import AgentRequest, Collaborator
from tests.gateways.conftest import Cast


def open_task_with_a_question(cast: Cast) -> tuple[AgentRequest, AgentRequest, Collaborator]:
    ext = Collaborator.objects.get(saga=cast.saga, name="ext")
    task, _ = actions.ask_agent(sender=ext, to="agent:slow", type="a2a.message", payload={"parts": [{"text": "hi"}]})
    question, _ = actions.ask_agent(
        sender=cast.slow, to="agent:ext", type="question", payload={"task_id": task.pk, "question": "Why?"}
    )
    return task, question, ext


def test_a_failure_while_declining_the_questions_cancels_nothing(cast: Cast, monkeypatch: pytest.MonkeyPatch) -> None:
    task, question, ext = open_task_with_a_question(cast)

    def crash(**kwargs: object) -> None:
        raise RuntimeError("the process dies here")

    monkeypatch.setattr(actions, "reply_to_request", crash)
    with pytest.raises(RuntimeError):
        handler.cancel(handler.Caller(sender=ext, agent=cast.slow), task.pk)

    assert AgentRequest.objects.get(pk=task.pk).is_open and AgentRequest.objects.get(pk=question.pk).is_open
    monkeypatch.undo()

    cancelled = handler.cancel(handler.Caller(sender=ext, agent=cast.slow), task.pk)

    assert cancelled.status == AgentRequest.Status.CANCELLED
    assert AgentRequest.objects.get(pk=question.pk).error == {
        "code": "task_cancelled", "message": "The client cancelled the task this question is about."}  # fmt: skip
