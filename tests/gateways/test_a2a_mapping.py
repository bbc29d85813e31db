"""How a request reads as an A2A task: states, parts, artifacts (no server needed)."""

import json

import pytest
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from django.utils import timezone
from google.protobuf.json_format import ParseDict

from gateways.a2a import mapping, push
from sagas.models import AgentRequest

Status = AgentRequest.Status


def request(status: str, *, reply: object = None, error: dict[str, str] | None = None) -> AgentRequest:
    payload = {"parts": [{"text": "hi"}], "message_id": "m-1", "context_id": "ctx"}
    return AgentRequest(id="req-1", status=status, payload=payload, reply=reply, error=error, updated_at=timezone.now())


@pytest.mark.parametrize(
    ("status", "error", "state"),
    [
        (Status.PENDING, None, pb.TASK_STATE_SUBMITTED),
        (Status.DELIVERED, None, pb.TASK_STATE_WORKING),
        (Status.COMPLETED, None, pb.TASK_STATE_COMPLETED),
        (Status.FAILED, {"code": "boom", "message": "It broke."}, pb.TASK_STATE_FAILED),
        (Status.FAILED, {"code": "refused", "message": "Not mine to do."}, pb.TASK_STATE_REJECTED),
        (Status.CANCELLED, None, pb.TASK_STATE_CANCELED),
        (Status.EXPIRED, None, pb.TASK_STATE_FAILED),
        (Status.RECIPIENT_UNAVAILABLE, None, pb.TASK_STATE_FAILED),
    ],
)
def test_each_request_status_is_a_task_state(status: str, error: dict[str, str] | None, state: int) -> None:
    task = mapping.task_of(request(status, reply={"ok": True} if status == Status.COMPLETED else None, error=error))
    assert task.status.state == state
    assert (task.id, task.context_id, task.history[0].parts[0].text) == ("req-1", "ctx", "hi")
    assert len(task.artifacts) == (1 if status == Status.COMPLETED else 0)
    if error:
        assert task.status.message.parts[0].text == error["message"]


def test_a_reply_becomes_parts() -> None:
    assert mapping.reply_parts("Done.") == [{"text": "Done."}]
    assert mapping.reply_parts({"n": 1}) == [{"data": {"n": 1}}]
    assert mapping.reply_parts({"parts": [{"text": "a"}, {"data": [1]}]}) == [{"text": "a"}, {"data": [1]}]
    assert mapping.task_of(request(Status.COMPLETED, reply={"n": 1}), history_length=0).history == []


def test_only_text_and_data_parts_are_accepted() -> None:
    text = pb.Message(message_id="m", role=pb.ROLE_USER, parts=[pb.Part(text="x")])
    assert mapping.payload_of(text, context_id="c") == {"parts": [{"text": "x"}], "message_id": "m", "context_id": "c"}
    with pytest.raises(ContentTypeNotSupportedError):
        mapping.payload_of(pb.Message(message_id="m", parts=[pb.Part(raw=b"\x00")]), context_id="c")
    with pytest.raises(InvalidParamsError):
        mapping.payload_of(pb.Message(message_id="m"), context_id="c")
    with pytest.raises(InvalidParamsError):
        mapping.payload_of(pb.Message(parts=[pb.Part(text="x")]), context_id="c")


@pytest.mark.parametrize(
    "url", ["ftp://hooks.example.com/", "http://" + "ü" * 60 + ".com/hook", "http://\u00ad.example.com/hook"]
)
def test_a_webhook_url_no_request_could_reach_is_refused_when_it_is_set(url: str) -> None:
    with pytest.raises(InvalidParamsError, match="http"):
        push.check(pb.TaskPushNotificationConfig(url=url))
    push.check(pb.TaskPushNotificationConfig(url="https://hooks.example.com/hook"))


def nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_a_data_part_too_deep_for_a_task_to_carry_is_refused_inbound_and_sent_as_text_outbound() -> None:
    """protobuf decodes at most 100 nested messages and a JSON object takes three: a task holding
    data nested about 33 deep could be written but never read back (a response, a page, a push)."""
    deep, fits = nested(mapping.MAX_DATA_DEPTH + 1), nested(mapping.MAX_DATA_DEPTH)
    with pytest.raises(InvalidParamsError, match="nests at most"):
        mapping.payload_of(pb.Message(message_id="m", parts=[ParseDict({"data": deep}, pb.Part())]), context_id="c")
    assert mapping.payload_of(pb.Message(message_id="m", parts=[ParseDict({"data": fits}, pb.Part())]), context_id="c")
    for reply in (nested(40), {"parts": [{"data": nested(40)}, {"text": "and more"}]}):
        task = mapping.task_of(request(Status.COMPLETED, reply=reply), history_length=0)
        page = pb.ListTasksResponse(tasks=[task])
        assert pb.ListTasksResponse.FromString(page.SerializeToString()) == page  # it decodes
        assert json.loads(task.artifacts[0].parts[0].text) == nested(40)
    kept = mapping.task_of(request(Status.COMPLETED, reply=fits), history_length=0)
    assert kept.artifacts[0].parts[0].HasField("data")
