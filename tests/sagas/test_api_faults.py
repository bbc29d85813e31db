"""Faults between a request and its reply: the database is the truth, Redis and processes are not."""

import pytest
from django.conf import LazySettings
from redis import Redis

from accounts.models import User
from agents.actions import load_profiles
from sagas import actions
from sagas.models import AgentRequest, Run, SteeringItem
from sagas.tasks import reconcile
from tests.sagas.api_http import Http
from tests.support import CeleryWorker, WebServer, wait_until

pytestmark = pytest.mark.integration


def responder_saga(alice: User) -> tuple[str, str]:
    """A saga with an external agent `ext` and an internal scripted `responder`; (saga id, ext's token)."""
    load_profiles(entries=[{"name": "responder", "role": "Responder", "model": "scripted:responder",
                            "tools": ["reply"], "resumable": True}])  # fmt: skip
    saga = actions.create_saga(title="Faults", goal="Lose nothing", owner=alice)
    _, token = actions.add_agent(saga=saga, name="ext", role="Client", task="Ask", runtime="external", by=alice)
    actions.add_agent(
        saga=saga, name="responder", role="Responder", task="Answer", runtime="internal", profile="responder", by=alice
    )
    assert token is not None
    return str(saga.pk), token


def drain_until_response(ext: Http, request_id: str) -> list[dict[str, object]]:
    """Every item of ext's steering up to the response to request_id, acknowledging as it goes."""
    seen: list[dict[str, object]] = []

    def look() -> bool:
        after = int(seen[-1]["seq"]) if seen else 0  # type: ignore[call-overload]
        seen.extend(ext.get(f"/api/v1/steering/?after={after}&wait=2").ok(200)["items"])
        return any(i["request_id"] == request_id and i["kind"] == "response" for i in seen)

    wait_until(look, timeout=60, interval=0, what="the response in ext's steering")
    ext.get(f"/api/v1/steering/?after={seen[-1]['seq']}&wait=0").ok(200)  # acknowledge everything seen
    return seen


def test_worker_killed_and_web_restarted_between_request_and_reply_the_reply_arrives_once(
    web_server: WebServer, celery_worker: CeleryWorker, alice: User
) -> None:
    saga_id, token = responder_saga(alice)
    wait_until(lambda: Run.objects.get(collaborator__name="responder").status == Run.Status.IDLE, timeout=60)
    celery_worker.kill()  # kill -9: nobody is left to run the responder's turn
    ext = Http(web_server.url, token)

    request_id = ext.post(
        f"/api/v1/sagas/{saga_id}/requests/",
        {"to": "agent:responder", "type": "echo.me", "payload": {"n": 1}},
        headers={"Idempotency-Key": "fault-1"},
    ).ok(202)["request_id"]
    web_server.restart()
    celery_worker.start()

    items = drain_until_response(ext, request_id)

    responses = [i for i in items if i["request_id"] == request_id]
    assert [(i["kind"], i["payload"]) for i in responses] == [("response", {"echo": {"n": 1}})]
    assert AgentRequest.objects.filter(sender__name="ext").count() == 1
    assert SteeringItem.objects.filter(request_id=request_id).count() == 2  # the request and its response


def test_after_redis_is_flushed_with_a_request_pending_the_reconciler_restores_delivery(
    web_server: WebServer, celery_worker: CeleryWorker, alice: User, redis_url: str, settings: LazySettings
) -> None:
    settings.AGORA_RERING_S = 1  # the reconciler below rings a queued run untouched for 1 s, not 15
    saga_id, token = responder_saga(alice)
    wait_until(lambda: Run.objects.get(collaborator__name="responder").status == Run.Status.IDLE, timeout=60)
    celery_worker.kill()
    ext = Http(web_server.url, token)
    request_id = ext.post(
        f"/api/v1/sagas/{saga_id}/requests/", {"to": "agent:responder", "type": "echo.me", "payload": {"n": 2}}
    ).ok(202)["request_id"]

    with Redis.from_url(redis_url) as client:
        client.flushdb()  # the queued turn is gone with everything else Redis held
    celery_worker.start()

    def delivered() -> bool:
        reconcile()  # as beat would, every few seconds
        return AgentRequest.objects.get(pk=request_id).status == AgentRequest.Status.COMPLETED

    wait_until(delivered, timeout=60, interval=0.5, what="the reconciler to restore the lost turn")
    items = drain_until_response(ext, request_id)
    assert [i["payload"] for i in items if i["request_id"] == request_id] == [{"echo": {"n": 2}}]
