"""Push notifications to a webhook receiver on 127.0.0.1, delivered by a real Celery worker, with a
retry when the receiver fails once."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb

from gateways.a2a.models import PushConfig
from sagas import actions
from tests.gateways.conftest import Cast, message, run
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.integration


class Receiver:
    """A webhook that answers 503 to its first call, then 200, and keeps what it was sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], Any]] = []
        self.failures_left = 1
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fail = receiver.failures_left > 0
                receiver.failures_left -= 1
                if not fail:
                    receiver.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(503 if fail else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def states(self) -> list[str]:
        return [body["task"]["status"]["state"] for _, body in self.calls]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.stop()


@pytest.fixture
def push_worker(transactional_db: None, redis_url: str, artifacts: Path) -> Iterator[CeleryWorker]:
    started = CeleryWorker(redis_url, artifacts, env={"AGORA_A2A_PUSH_PRIVATE_URLS": "1"})
    yield started
    started.kill()


def test_a_webhook_gets_each_state_once_after_a_retry(
    web_server: WebServer, push_worker: CeleryWorker, cast: Cast, receiver: Receiver
) -> None:
    slow = cast.agent_url(web_server.url, "slow")

    async def send_with_push(client: Client) -> tuple[pb.Task, pb.ListTaskPushNotificationConfigsResponse]:
        request = pb.SendMessageRequest(message=message("tell me when"))
        request.configuration.return_immediately = True
        request.configuration.task_push_notification_config.url = receiver.url
        request.configuration.task_push_notification_config.token = "client-secret"
        response = await anext(aiter(client.send_message(request)))
        task = response.task
        listed = await client.list_task_push_notification_configs(
            pb.ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        return task, listed

    task, listed = run(slow, cast.ext_token, send_with_push)
    assert [c.url for c in listed.configs] == [receiver.url]
    # The first delivery meets a 503; the retry brings the submitted task.
    wait_until(lambda: receiver.states() == ["TASK_STATE_SUBMITTED"], timeout=30, what="the first push")
    # The worker records the state once the webhook's answer is in, a moment after the receiver saw it.
    wait_until(
        lambda: PushConfig.objects.get(request_id=task.id).pushed_state == "TASK_STATE_SUBMITTED",
        timeout=10,
        what="the pushed state recorded",
    )
    actions.reply_to_request(request_id=task.id, by=cast.slow.user, payload={"answer": 42})
    wait_until(
        lambda: receiver.states() == ["TASK_STATE_SUBMITTED", "TASK_STATE_COMPLETED"], timeout=30, what="the final push"
    )
    headers, body = receiver.calls[-1]
    assert headers["x-a2a-notification-token"] == "client-secret"
    assert body["task"]["id"] == task.id
    assert body["task"]["artifacts"][0]["parts"] == [{"data": {"answer": 42}}]
