"""A task's history, read from the kernel's own records: no store of its own.

The conversation of a task is, in order: the client's first message (the request's payload), each
question the agent asked back (its requests to the caller about the task) and the client's answer
to it (that request's reply, which the gateway writes with the task's id), the client's follow-ups
(steering items `{"request_id", "message"}` the caller sent the agent about the task), and the
agent's reply once the task is completed. Two queries for any number of tasks of one caller with
one agent: the agent's requests to the caller, and the caller's follow-ups.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from gateways.a2a import conversation, mapping
from sagas.models import AgentRequest, SteeringItem

Status = AgentRequest.Status


@dataclass(frozen=True)
class Conversations:
    """The open question of each open task, and each task's history (oldest message first)."""

    questions: dict[str, AgentRequest]
    histories: dict[str, list[dict[str, Any]]]


def load(tasks: Sequence[AgentRequest], *, with_history: bool = True) -> Conversations:
    """For tasks all of one caller with one agent."""
    if not tasks:
        return Conversations({}, {})
    ids = [task.pk for task in tasks]
    some = tasks[0]
    linked = Q(status__in=AgentRequest.OPEN)
    if with_history:
        linked |= Q(payload__task_id__in=ids) | Q(reply__task_id__in=ids)
    back = AgentRequest.objects.filter(sender_id=some.recipient_id, recipient_id=some.sender_id).filter(linked)
    asked = list(back.order_by("created_at", "pk"))
    questions = open_questions(tasks, [q for q in asked if q.is_open])
    if not with_history:
        return Conversations(questions, {})
    follow_ups = SteeringItem.objects.filter(
        recipient_id=some.recipient_id, kind=SteeringItem.Kind.MESSAGE, sender=some.sender.handle,
        payload__request_id__in=ids,
    ).order_by("seq")  # fmt: skip
    by_task: dict[str, list[tuple[Any, int, dict[str, Any]]]] = {task.pk: [] for task in tasks}
    by_id = {task.pk: task for task in tasks}
    for item in follow_ups:
        body = item.payload if isinstance(item.payload, dict) else {}
        task_id = str(body.get("request_id"))
        if task_id in by_id:
            by_task[task_id].append((item.created_at, 2, follow_up_message(by_id[task_id], body.get("message"))))
    for question in asked:
        about = linked_task(question, questions)
        if about is None or about not in by_id:
            continue
        task = by_id[about]
        by_task[about].append((question.created_at, 1, mapping.question_message(task, question)))
        if question.status == Status.COMPLETED and isinstance(question.reply, dict):
            by_task[about].append((question.updated_at, 2, answer_message(task, question)))
    histories = {}
    for task in tasks:
        entries = [(task.created_at, 0, mapping.user_message(task)), *by_task[task.pk]]
        if task.status == Status.COMPLETED:
            entries.append((task.updated_at, 3, reply_message(task)))
        entries.sort(key=lambda entry: (entry[0], entry[1]))
        histories[task.pk] = [message for _, _, message in entries]
    return Conversations(questions, histories)


def open_questions(tasks: Sequence[AgentRequest], asked: list[AgentRequest]) -> dict[str, AgentRequest]:
    """The oldest open question of each open task (`conversation.questions_for`, on rows read)."""
    wanted = {task.pk for task in tasks if task.is_open}
    if not wanted or not asked:
        return {}
    some = next(task for task in tasks if task.is_open)
    unlinked = any(
        not (isinstance(q.payload, dict) and isinstance(q.payload.get(conversation.TASK_LINK), str)) for q in asked
    )
    candidates = conversation.open_tasks(some) if unlinked else []
    found: dict[str, AgentRequest] = {}
    for question in asked:
        task_id = conversation.task_of_question(question, candidates)
        if task_id in wanted and task_id not in found:
            found[task_id] = question
    return found


def linked_task(question: AgentRequest, open_ones: dict[str, AgentRequest]) -> str | None:
    for key in (question.payload, question.reply):
        if isinstance(key, dict) and isinstance(key.get(conversation.TASK_LINK), str):
            return str(key[conversation.TASK_LINK])
    return next((task_id for task_id, q in open_ones.items() if q.pk == question.pk), None)


def user_parts(body: Any) -> list[dict[str, Any]]:
    if isinstance(body, dict) and isinstance(body.get("parts"), list):
        return [part for part in body["parts"] if isinstance(part, dict)]
    return mapping.reply_parts(body)


def answer_message(task: AgentRequest, question: AgentRequest) -> dict[str, Any]:
    reply = question.reply if isinstance(question.reply, dict) else {}
    return {
        "messageId": str(reply.get("message_id", f"{question.pk}-answer")),
        "contextId": mapping.context_of(task),
        "taskId": task.pk,
        "role": "ROLE_USER",
        "parts": user_parts(reply),
    }


def follow_up_message(task: AgentRequest, body: Any) -> dict[str, Any]:
    message_id = body.get("message_id") if isinstance(body, dict) else None
    return {
        "messageId": str(message_id or f"{task.pk}-follow-up"),
        "contextId": mapping.context_of(task),
        "taskId": task.pk,
        "role": "ROLE_USER",
        "parts": user_parts(body),
    }


def reply_message(task: AgentRequest) -> dict[str, Any]:
    return {
        "messageId": f"{task.pk}-reply",
        "contextId": mapping.context_of(task),
        "taskId": task.pk,
        "role": "ROLE_AGENT",
        "parts": mapping.reply_parts(task.reply),
    }
