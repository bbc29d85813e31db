"""A remote agent that answers a message with an open task but no task id leaves nothing to follow:
the call fails with `remote_error` at once, and the message is not sent again; so does one whose
task's ids no column holds. What a remote agent answers is kept with U+FFFD for what no column
stores (each of these failed the call's step with a database error on PostgreSQL, again at each
of its retries)."""

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import a2a_pb2 as pb
from django.conf import LazySettings
from django.utils import timezone

from accounts.models import User
from gateways.a2a import outbound
from sagas import actions
from sagas.remotes import RemoteCall
from tests.gateways.test_a2a_outbound_screen import Recorder

pytestmark = pytest.mark.django_db(transaction=True)


class Anonymous(Recorder):
    """Serves its card on GET; answers every message with `task` (a `working` task that has no
    id, unless a test says otherwise)."""

    seen: list[tuple[str, str, str | None]] = []
    task: dict[str, Any] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        self.answer(json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": {"task": self.task}}).encode())


@pytest.fixture
def remote() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Anonymous)
    url = f"http://127.0.0.1:{server.server_port}/agent/"
    interface = pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
    card = pb.AgentCard(name="anonymous", description="d", version="1", supported_interfaces=[interface])
    Anonymous.card, Anonymous.seen = json.dumps(agent_card_to_dict(card)).encode(), []
    Anonymous.task = {"id": "", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield url
    server.shutdown()
    server.server_close()


def call_to(remote: str, alice: User) -> RemoteCall:
    saga = actions.create_saga(title="Caller", owner=alice)
    agent = actions.allow_remote_agent(saga=saga, name="anon", url=remote, by=alice)
    caller, _ = actions.add_agent(saga=saga, name="caller", role="Caller", task="Ask", runtime="external", by=alice)
    now = timezone.now()
    return RemoteCall.objects.create(
        saga=saga, caller=caller, remote_agent=agent, agent_name="anon", url=remote, message="hi",
        deadline=now + timedelta(seconds=60), next_step_at=now,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("task", "why"),
    [
        ({}, "TASK_STATE_WORKING without a task id"),
        ({"id": "t" * 201}, "a task id no column holds (201 characters)"),
        ({"id": "t\u0000"}, "a task id no column holds (2 characters)"),
        ({"id": "t", "contextId": "c" * 201}, "a context id no column holds (201 characters)"),
    ],
)
def test_a_task_that_cannot_be_followed_fails_the_call_and_is_not_sent_again(
    remote: str, alice: User, settings: LazySettings, task: dict[str, Any], why: str
) -> None:
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = True  # the remote listens on 127.0.0.1
    Anonymous.task = {**Anonymous.task, **task}
    call = call_to(remote, alice)

    outbound.follow(call.pk, call.step)
    outbound.follow(call.pk, call.step + 1)  # the next step's doorbell, had one been rung

    call.refresh_from_db()
    error = call.error or {}
    assert call.status == RemoteCall.Status.FAILED and error.get("code") == "remote_error"
    assert why in error.get("message", "")
    assert [method for method, _, _ in Anonymous.seen].count("POST") == 1  # the message went once


def test_what_a_remote_agent_answers_is_kept_with_what_no_column_stores_replaced(
    remote: str, alice: User, settings: LazySettings
) -> None:
    settings.AGORA_A2A_REMOTE_PRIVATE_URLS = True
    answer = {"role": "ROLE_AGENT", "messageId": "m", "parts": [{"text": "done\u0000 here"}]}
    # A finished task's context id is not kept: however long, its answer is.
    Anonymous.task = {"id": "t", "contextId": "c" * 201, "status": {"state": "TASK_STATE_COMPLETED", "message": answer}}
    call = call_to(remote, alice)

    outbound.follow(call.pk, call.step)

    call.refresh_from_db()
    assert (call.status, call.reply) == (RemoteCall.Status.COMPLETED, "done\ufffd here")
