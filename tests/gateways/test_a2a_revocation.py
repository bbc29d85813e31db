"""An open A2A stream ends once what authorized it is gone, as a REST long-poll does: the caller's
token revoked, or the agent no longer exposed. What the agent answers after is not streamed."""

import json
import threading
from collections.abc import Callable
from datetime import timedelta

import httpx
import pytest
from a2a.utils.errors import InvalidRequestError
from django.utils import timezone

from accounts.models import ApiToken, User
from gateways.a2a import handler
from sagas import actions
from sagas.models import AgentRequest, Collaborator
from tests.gateways.conftest import Cast
from tests.support import WebServer, wait_until

pytestmark = pytest.mark.integration

HEADERS = {"A2A-Version": "1.0", "Content-Type": "application/json"}


# What authorized a caller, withdrawn: its token revoked, or the agent no longer exposed.
WITHDRAWALS = pytest.mark.parametrize(
    "withdraw",
    [
        lambda cast, alice: actions.revoke_agent_token(saga=cast.saga, handle="agent:ext", by=alice),
        lambda cast, alice: actions.set_exposed(saga=cast.saga, handle="agent:slow", exposed=False, by=alice),
    ],
    ids=["token revoked", "exposure withdrawn"],
)


def call(method: str, params: dict[str, object]) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


@WITHDRAWALS
def test_a_stream_ends_once_its_authorization_is_withdrawn(
    web_server: WebServer, cast: Cast, alice: User, withdraw: Callable[[Cast, User], object]
) -> None:
    url, auth = cast.agent_url(web_server.url, "slow"), {"Authorization": f"Bearer {cast.ext_token}", **HEADERS}
    message = {"messageId": "rev-1", "role": "ROLE_USER", "parts": [{"text": "Think it over."}]}
    sent = httpx.post(url, json=call("SendMessage", {"message": message, "configuration": {"returnImmediately": True}}),
                      headers=auth, timeout=30).json()  # fmt: skip
    task_id = sent["result"]["task"]["id"]
    events: list[dict[str, object]] = []

    def subscribe() -> None:
        body = call("SubscribeToTask", {"id": task_id})
        with httpx.stream("POST", url, json=body, headers=auth, timeout=30) as stream:
            events.extend(json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:"))

    reader = threading.Thread(target=subscribe)
    reader.start()
    try:
        wait_until(lambda: bool(events), timeout=30, what="the stream's first event")
        withdraw(cast, alice)
        reader.join(timeout=20)
        assert not reader.is_alive(), "the stream outlived its authorization"
    finally:
        reader.join(timeout=30)
    actions.reply_to_request(request_id=task_id, by=cast.slow.user, payload={"secret": "after"})
    assert "error" in events[-1] and "after" not in json.dumps(events)


@WITHDRAWALS
def test_a_blocking_send_gets_no_reply_once_its_authorization_is_withdrawn(
    web_server: WebServer, cast: Cast, alice: User, withdraw: Callable[[Cast, User], object]
) -> None:
    url, auth = cast.agent_url(web_server.url, "slow"), {"Authorization": f"Bearer {cast.ext_token}", **HEADERS}
    message = {"messageId": "rev-2", "role": "ROLE_USER", "parts": [{"text": "Tell me a secret."}]}
    answers: list[dict[str, object]] = []

    def send() -> None:
        body = call("SendMessage", {"message": message, "configuration": {"returnImmediately": False}})
        answers.append(httpx.post(url, json=body, headers=auth, timeout=60).json())

    sender = threading.Thread(target=send)
    sender.start()
    try:
        request = wait_until(lambda: AgentRequest.objects.filter(recipient=cast.slow).first(), timeout=30,
                             what="the blocking send's task")  # fmt: skip
        withdraw(cast, alice)
        actions.reply_to_request(request_id=request.pk, by=cast.slow.user, payload={"secret": "for ext only"})
    finally:
        sender.join(timeout=30)
    assert not sender.is_alive() and len(answers) == 1
    assert "error" in answers[0] and "for ext only" not in json.dumps(answers)


@pytest.mark.parametrize("withdraw", ["token", "exposure"])
def test_a_reply_committed_after_a_withdrawal_is_never_read_as_allowed(
    cast: Cast, alice: User, monkeypatch: pytest.MonkeyPatch, withdraw: str
) -> None:
    """A blocking send's look at its task: the withdrawal of what authorized it, then the reply,
    both committed while it looks (between its authorization check and its read) are refused, not
    read as the reply to an allowed caller."""
    ext = Collaborator.objects.get(saga=cast.saga, name="ext")
    token = ApiToken.objects.get(user=ext.user)
    task, _ = actions.ask_agent(sender=ext, to="agent:slow", type="a2a.message", payload={"parts": [{"text": "hi"}]})
    read = handler.snapshot

    def meanwhile(request_id: str) -> handler.Snapshot:
        if withdraw == "token":
            actions.revoke_agent_token(saga=cast.saga, handle="agent:ext", by=alice)
        else:
            actions.set_exposed(saga=cast.saga, handle="agent:slow", exposed=False, by=alice)
        actions.reply_to_request(request_id=task.pk, by=cast.slow.user, payload={"secret": "for ext only"})
        return read(request_id)

    monkeypatch.setattr(handler, "snapshot", meanwhile)
    caller = handler.Caller(sender=ext, agent=cast.slow, token_id=token.pk)
    with pytest.raises(InvalidRequestError):
        handler.settled(caller, task.pk, timezone.now() + timedelta(seconds=30))
