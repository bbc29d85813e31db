"""Tasks of more than one message: the agent asking back, and the client's further messages.

An exposed agent asks back with the kernel's own `ask_agent`, addressed to the caller (the A2A
client's agent collaborator). That open request is the task's question, and the task is
`input-required` while it is open: the request's payload `task_id` names the task it is about;
without it, it is about the caller's newest task with that agent that was open when it was asked.

A client's `SendMessage` with the `taskId` of a task that is still open is either the answer to
the task's question (the kernel's `reply_to_request`, by the caller) or, when the agent asked
nothing, a follow-up the agent reads at its next turn (`follow_up_request`). A terminal task takes
no further message (`UnsupportedOperationError`, as the spec says). Cancelling a task declines
its open questions.
"""

from collections.abc import Sequence
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, UnsupportedOperationError
from google.protobuf.json_format import MessageToDict

from gateways.a2a import mapping
from sagas import actions, errors
from sagas.models import AgentRequest, Collaborator, SteeringItem

TASK_LINK = "task_id"  # the key of an ask-back's payload that names its task
TASK_CANCELLED = {"code": "task_cancelled", "message": "The client cancelled the task this question is about."}
OPEN = AgentRequest.OPEN


def questions_for(tasks: Sequence[AgentRequest]) -> dict[str, AgentRequest]:
    """The open question of each open task among these (all of one caller with one agent), by
    task id; the oldest question first, if the agent asked several."""
    wanted = {task.pk for task in tasks if task.is_open}
    if not wanted:
        return {}
    some = next(task for task in tasks if task.is_open)
    back = AgentRequest.objects.filter(sender_id=some.recipient_id, recipient_id=some.sender_id, status__in=OPEN)
    asked = list(back.select_related("sender", "recipient").order_by("created_at", "pk"))
    if not asked:
        return {}
    candidates = open_tasks(some)
    found: dict[str, AgentRequest] = {}
    for question in asked:
        task_id = task_of_question(question, candidates)
        if task_id in wanted and task_id not in found:
            found[task_id] = question
    return found


def open_tasks(task: AgentRequest) -> list[tuple[str, Any]]:
    """(id, created_at) of the open tasks between this task's caller and agent, newest first."""
    tasks = AgentRequest.objects.filter(
        sender_id=task.sender_id, recipient_id=task.recipient_id, type=mapping.REQUEST_TYPE, status__in=OPEN
    )
    return list(tasks.order_by("-created_at", "-pk").values_list("pk", "created_at"))


def task_of_question(question: AgentRequest, candidates: list[tuple[str, Any]]) -> str | None:
    named = question.payload.get(TASK_LINK) if isinstance(question.payload, dict) else None
    if isinstance(named, str):
        return named
    # The newest task that was open when the agent asked (candidates come newest first).
    return next((pk for pk, created_at in candidates if created_at <= question.created_at), None)


def asking_tasks(sender_id: Any, agent_id: Any) -> set[str]:
    """The ids of the caller's open tasks with this agent that have an open question: the tasks
    that are input-required."""
    back = AgentRequest.objects.filter(sender_id=agent_id, recipient_id=sender_id, status__in=OPEN)
    asked = list(back.order_by("created_at", "pk"))
    if not asked:
        return set()
    tasks = AgentRequest.objects.filter(
        sender_id=sender_id, recipient_id=agent_id, type=mapping.REQUEST_TYPE, status__in=OPEN
    )
    candidates = list(tasks.order_by("-created_at", "-pk").values_list("pk", "created_at"))
    open_ids = {pk for pk, _ in candidates}
    return {task_id for q in asked if (task_id := task_of_question(q, candidates)) in open_ids}


def question_of(task: AgentRequest) -> AgentRequest | None:
    return questions_for([task]).get(task.pk)


def all_questions_of(task: AgentRequest) -> list[AgentRequest]:
    """Every open question about this open task (question_of gives the oldest)."""
    if not task.is_open:
        return []
    back = AgentRequest.objects.filter(sender_id=task.recipient_id, recipient_id=task.sender_id, status__in=OPEN)
    candidates = open_tasks(task)
    return [q for q in back.order_by("created_at", "pk") if task_of_question(q, candidates) == task.pk]


def decline_questions(sender: Collaborator, questions: list[AgentRequest]) -> None:
    """The client cancelled the task: its open questions are answered with an error, so that they
    neither wait for an answer that will not come nor count against the agent's open requests."""
    for question in questions:
        try:
            actions.reply_to_request(request_id=question.pk, by=sender.user, error=TASK_CANCELLED)
        except (errors.AlreadyAnswered, errors.RequestClosed, errors.RequestCancelled):
            continue  # answered or withdrawn meanwhile


def continue_task(sender: Collaborator, task: AgentRequest, message: pb.Message) -> AgentRequest:
    """A further message to one of the caller's tasks: the answer to its question, or a follow-up."""
    if resent(sender, task, message):
        return task  # a resend of a message the agent has: the task as it stands, even finished
    question = question_of(task)
    if mapping.state_of(task, question) in mapping.TERMINAL:
        raise UnsupportedOperationError(message=f"Task {task.pk} is {task.status}; start a new task.")
    context_id = mapping.context_of(task)
    if message.context_id and message.context_id != context_id:
        raise InvalidParamsError(message=f"Task {task.pk} belongs to context {context_id}.")
    body = mapping.payload_of(message, context_id=context_id)
    if question is not None:  # the answer names its task: how the task's history finds it
        answer = {**body, TASK_LINK: task.pk}
        actions.reply_to_request(request_id=question.pk, by=sender.user, payload=answer)
    else:
        actions.follow_up_request(
            request_id=task.pk, by=sender.user, message=body, idempotency_key=f"a2a:{message.message_id}"
        )
    return task


def resent(sender: Collaborator, task: AgentRequest, message: pb.Message) -> bool:
    """Whether the agent has this message about this task already, by its messageId: as the answer
    to a question, or as a follow-up (its key, follow_up_request's). Resent, it is neither sent
    again nor the answer to a question asked since; the same id with other parts is -32602."""
    answered = AgentRequest.objects.filter(
        sender_id=task.recipient_id, recipient=sender, reply__message_id=message.message_id,
        **{f"reply__{TASK_LINK}": task.pk},
    ).values_list("reply", flat=True)  # fmt: skip
    followed = SteeringItem.objects.filter(
        recipient_id=task.recipient_id, kind=SteeringItem.Kind.MESSAGE, sender=sender.handle,
        payload__request_id=task.pk, payload__key=f"a2a:{message.message_id}",
    ).values_list("payload", flat=True)  # fmt: skip
    first = answered.first() or (followed.first() or {}).get("message")
    if first is None:
        return False
    if first.get("parts") != [MessageToDict(part) for part in message.parts]:
        raise InvalidParamsError(message=f"messageId {message.message_id} was sent with other parts.")
    return True
