"""The A2A task IS the kernel's AgentRequest: how one is read as the other.

An A2A message becomes the request's payload (its parts in their JSON form, with the message and
context ids), the request's status becomes the task's state, and the reply becomes the task's one
artifact. Nothing here writes: the handler calls the kernel's actions.
"""

import json
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf.json_format import MessageToDict, ParseDict

from sagas.models import AgentRequest

REQUEST_TYPE = "a2a.message"
Status = AgentRequest.Status

STATES: dict[str, int] = {
    Status.PENDING: pb.TASK_STATE_SUBMITTED,
    Status.DELIVERED: pb.TASK_STATE_WORKING,
    Status.COMPLETED: pb.TASK_STATE_COMPLETED,
    Status.FAILED: pb.TASK_STATE_FAILED,
    Status.CANCELLED: pb.TASK_STATE_CANCELED,
    Status.EXPIRED: pb.TASK_STATE_FAILED,
    Status.RECIPIENT_UNAVAILABLE: pb.TASK_STATE_FAILED,
}
# A request the recipient turned down with this error code is a rejected task, not a failed one.
REFUSED = "refused"
TERMINAL = frozenset({pb.TASK_STATE_COMPLETED, pb.TASK_STATE_FAILED, pb.TASK_STATE_CANCELED, pb.TASK_STATE_REJECTED})
# Where a blocking send returns and a stream closes (the spec's terminal and interrupted states).
SETTLED = TERMINAL | {pb.TASK_STATE_INPUT_REQUIRED}

# How deep a data part nests, at most: a task carrying it (in a response, a page of ListTasks, a
# push) must still decode within protobuf's limit of 100 nested messages, and a JSON object takes
# three of them per level.
MAX_DATA_DEPTH = 24

# The request statuses a `status` filter of ListTasks stands for.
STATUSES_OF_STATE: dict[int, list[str]] = {}
for _status, _state in STATES.items():
    STATUSES_OF_STATE.setdefault(_state, []).append(_status)


def payload_of(message: pb.Message, *, context_id: str) -> dict[str, Any]:
    """The request payload for an inbound message: text and data parts only."""
    if not message.message_id:
        raise InvalidParamsError(message="message.messageId is required.")
    if not message.parts:
        raise InvalidParamsError(message="A message needs at least one part.")
    parts = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind not in ("text", "data"):
            raise ContentTypeNotSupportedError(message=f"This agent accepts text and data parts, not {kind}.")
        if kind == "data" and nesting(MessageToDict(part.data)) > MAX_DATA_DEPTH:
            raise InvalidParamsError(message=f"A data part nests at most {MAX_DATA_DEPTH} levels.")
        parts.append(MessageToDict(part))
    return {"parts": parts, "message_id": message.message_id, "context_id": context_id}


def state_of(request: AgentRequest, question: AgentRequest | None = None) -> int:
    """The task's state; `question` is the agent's open request back to the caller about this task
    (`gateways.a2a.conversation`), which makes an open task input-required."""
    if question is not None and request.is_open:
        return pb.TASK_STATE_INPUT_REQUIRED
    if request.status == Status.FAILED and (request.error or {}).get("code") == REFUSED:
        return pb.TASK_STATE_REJECTED
    return STATES[request.status]


def reply_parts(reply: Any) -> list[dict[str, Any]]:
    """An agent's reply as parts: its own parts when it wrote A2A parts, else text or data; data
    nested deeper than a task carries goes as its JSON text."""
    if isinstance(reply, dict) and isinstance(reply.get("parts"), list):
        return [carried(part) for part in reply["parts"] if isinstance(part, dict)]
    if isinstance(reply, str):
        return [{"text": reply}]
    return [carried({"data": reply})]


def carried(part: dict[str, Any]) -> dict[str, Any]:
    if "data" in part and nesting(part["data"]) > MAX_DATA_DEPTH:
        return {"text": json.dumps(part["data"], ensure_ascii=False)}
    return part


def nesting(value: Any) -> int:
    """How many objects and arrays deep a JSON value is (0 for a scalar)."""
    depth, level = 0, [value]
    while containers := [v for v in level if isinstance(v, dict | list)]:
        depth += 1
        level = [child for c in containers for child in (c.values() if isinstance(c, dict) else c)]
    return depth


def user_message(request: AgentRequest) -> dict[str, Any]:
    payload = request.payload if isinstance(request.payload, dict) else {}
    return {
        "messageId": str(payload.get("message_id", request.pk)),
        "contextId": context_of(request),
        "taskId": request.pk,
        "role": "ROLE_USER",
        "parts": payload.get("parts", [{"data": request.payload}]),
    }


def context_of(request: AgentRequest) -> str:
    payload = request.payload if isinstance(request.payload, dict) else {}
    return str(payload.get("context_id", ""))


def question_message(request: AgentRequest, question: AgentRequest) -> dict[str, Any]:
    """The agent's question, as the agent message of an input-required status."""
    payload = question.payload
    if isinstance(payload, dict) and "task_id" in payload and "parts" not in payload:
        payload = {k: v for k, v in payload.items() if k != "task_id"}  # the link, not the question
        if list(payload) == ["question"]:
            payload = payload["question"]
    return {
        "messageId": question.pk,
        "contextId": context_of(request),
        "taskId": request.pk,
        "role": "ROLE_AGENT",
        "parts": reply_parts(payload),
        "metadata": {"request_id": question.pk, "type": question.type},
    }


def status_message(request: AgentRequest, question: AgentRequest | None = None) -> dict[str, Any] | None:
    """The agent's question, or why a task ended without a reply, as an agent message."""
    if question is not None and request.is_open:
        return question_message(request, question)
    if request.status == Status.COMPLETED or request.is_open:
        return None
    error = request.error or {}
    text = error.get("message") or error.get("code") or request.status.replace("_", " ")
    return {
        "messageId": f"{request.pk}-status",
        "contextId": context_of(request),
        "taskId": request.pk,
        "role": "ROLE_AGENT",
        "parts": [{"text": str(text)}],
        "metadata": {"status": request.status, **({"code": error["code"]} if "code" in error else {})},
    }


def status_of(request: AgentRequest, question: AgentRequest | None = None) -> dict[str, Any]:
    state = pb.TaskState.Name(state_of(request, question))
    changed = max(request.updated_at, question.created_at) if question is not None else request.updated_at
    status: dict[str, Any] = {"state": state, "timestamp": changed.isoformat()}
    if (message := status_message(request, question)) is not None:
        status["message"] = message
    return status


def artifact_of(request: AgentRequest) -> dict[str, Any]:
    return {"artifactId": f"{request.pk}-reply", "name": "reply", "parts": reply_parts(request.reply)}


def task_of(
    request: AgentRequest,
    *,
    question: AgentRequest | None = None,
    history: list[dict[str, Any]] | None = None,
    history_length: int | None = None,
    artifacts: bool = True,
) -> pb.Task:
    """The task a request is, for its sender: `history` is the whole conversation
    (`gateways.a2a.history`), of which the last `history_length` messages are given (0: none,
    absent: all); without it, the client's first message."""
    if history is None:
        history = [user_message(request)]
    if history_length is not None:
        history = history[-history_length:] if history_length > 0 else []
    body: dict[str, Any] = {
        "id": request.pk,
        "contextId": context_of(request),
        "status": status_of(request, question),
        "history": history,
    }
    if artifacts and request.status == Status.COMPLETED:
        body["artifacts"] = [artifact_of(request)]
    return ParseDict(body, pb.Task())


def status_event(request: AgentRequest, question: AgentRequest | None = None) -> pb.TaskStatusUpdateEvent:
    return ParseDict(
        {"taskId": request.pk, "contextId": context_of(request), "status": status_of(request, question)},
        pb.TaskStatusUpdateEvent(),
    )


def artifact_event(request: AgentRequest) -> pb.TaskArtifactUpdateEvent:
    return ParseDict(
        {"taskId": request.pk, "contextId": context_of(request), "artifact": artifact_of(request), "lastChunk": True},
        pb.TaskArtifactUpdateEvent(),
    )
