"""An external agent over HTTP and an internal agent run by a real Celery worker, in one saga: the
HTTP wait is answered by the internal agent's turn, with nothing but the kernel between them."""

import pytest

from accounts.models import User
from agents.actions import load_profiles
from sagas import actions
from sagas.models import Run
from tests.sagas.api_http import Http
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.integration


def test_an_external_agent_waits_over_http_on_an_internal_agents_reply(
    web_server: WebServer, celery_worker: CeleryWorker, alice: User
) -> None:
    load_profiles(entries=[{"name": "responder", "role": "Responder", "model": "scripted:responder",
                            "tools": ["reply", "finish"], "resumable": True}])  # fmt: skip
    saga = actions.create_saga(title="Mixed", goal="Both kinds of agent", owner=alice)
    _, token = actions.add_agent(saga=saga, name="ext", role="Client", task="Ask", runtime="external", by=alice)
    assert token is not None
    responder, _ = actions.add_agent(
        saga=saga, name="responder", role="Responder", task="Answer", runtime="internal", profile="responder", by=alice
    )
    ext = Http(web_server.url, token)
    # The responder's first turn finds nothing to do and leaves it idle, waiting for steering.
    wait_until(
        lambda: Run.objects.get(collaborator=responder).status in (Run.Status.IDLE, Run.Status.COMPLETED),
        timeout=60,
        what="the responder's first turn",
    )

    answered = ext.post(
        f"/api/v1/sagas/{saga.pk}/requests/",
        {"to": "agent:responder", "type": "echo.me", "payload": {"n": 7}, "mode": "wait", "timeout_s": 60},
        headers={"Idempotency-Key": "ext-1"},
    ).ok(200)
    assert answered == {
        "request_id": answered["request_id"],
        "status": "completed",
        "from": "agent:responder",
        "payload": {"echo": {"n": 7}},
    }
    # ...and, as every reply, it is also in the sender's steering.
    item = ext.steering_item(0, lambda i: i["request_id"] == answered["request_id"])
    assert (item["kind"], item["status"], item["payload"]) == ("response", "completed", {"echo": {"n": 7}})
