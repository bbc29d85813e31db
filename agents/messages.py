"""What a turn writes into its transcript for the model to read: tool results, steering items with
their engine-written header, and tool call ids made unique within the run."""

import hashlib
import json
import re
from typing import Any

from agents import scripted
from sagas.models import AgentRequest, SteeringItem

# A call's id becomes part of the kernel's keys: a request's idempotency key (`<run id>:<call id>`,
# 200 characters) and a parked wait's `wait_tool_call_id` (120).
CALL_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def distinct_call_ids(calls: list[dict[str, Any]], history: list[dict[str, Any]], *, turn: int) -> None:
    """A tool call's id is its idempotency key within the run (tools.Call.key): a provider that
    reuses ids (`call_0` at every turn), repeats one within a message or sends none would have a
    later call answered with an earlier one's result and never made. Such an id is made unique
    here, before the message is stored, so that the transcript, the model and the tools see one id.
    So is one the keys it becomes part of cannot hold (longer than 64 characters, or other than
    letters, digits and `_.:-`: a NUL, say, that PostgreSQL refuses): a digest of it takes its place."""
    used = {call["id"] for message in history for call in message.get("tool_calls") or []}
    for index, call in enumerate(calls):
        if call["id"] and not CALL_ID_RE.fullmatch(call["id"]):
            call["id"] = f"call_{hashlib.sha256(call['id'].encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"
        while not call["id"] or call["id"] in used:
            call["id"] = f"{call['id'] or 'call'}.{turn}.{index}"
        used.add(call["id"])


def tool_message(call_id: str, result: dict[str, Any]) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)}


def render(item: SteeringItem) -> str:
    """One steering item with its engine-written header: the model can trust who sent it."""
    request: AgentRequest | None = item.request
    attrs: dict[str, Any] = {"kind": item.kind, "from": item.sender}
    if request is not None:
        attrs.update(request_id=request.pk, type=request.type)
        if item.kind != SteeringItem.Kind.REQUEST:
            attrs["status"] = request.status
    if item.human_request_id:
        attrs["human_request_id"] = item.human_request_id
    if item.broadcast_id:
        attrs["broadcast_id"] = item.broadcast_id
    if item.sender.startswith("remote:") and isinstance(item.payload, dict):  # an ask_remote_agent outcome
        attrs.update(call_id=item.payload.get("call_id"), status=item.payload.get("status"))
    payload = {"error": request.error} if request is not None and request.error else item.payload
    return scripted.header(**attrs) + "\n" + json.dumps(payload, ensure_ascii=False)
