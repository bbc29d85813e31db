"""What a turn writes into its transcript for the model to read: tool results, steering items with
their engine-written header, and tool call ids made unique within the run."""

import json
from typing import Any

from agents import scripted
from sagas.models import AgentRequest, SteeringItem


def distinct_call_ids(calls: list[dict[str, Any]], history: list[dict[str, Any]], *, turn: int) -> None:
    """A tool call's id is its idempotency key within the run (tools.Call.key): a provider that
    reuses ids (`call_0` at every turn), repeats one within a message or sends none would have a
    later call answered with an earlier one's result and never made. Such an id is made unique
    here, before the message is stored, so that the transcript, the model and the tools see one id."""
    used = {call["id"] for message in history for call in message.get("tool_calls") or []}
    for index, call in enumerate(calls):
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
