"""Outbound A2A: an internal agent (on the fake model server) calls remote A2A agents with
`ask_remote_agent`. The remote agents are our own, exposed by the gateway of a real daphne in
another saga, so every call is a real A2A round trip through the a2a-sdk client, made by a real
Celery worker whose environment holds the bearer token the endpoint's row names."""

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import LazySettings
from django.utils import timezone

from accounts.models import User
from agents.actions import load_profiles
from journal.models import JournalEvent
from sagas import actions
from sagas.models import AgentRequest, Collaborator, RemoteCall, Run, Saga, SteeringItem
from sagas.tasks import reconcile
from tests.agents.fake_llm import FakeLLM, finish_once_answered, say, tool_call
from tests.gateways.conftest import Cast
from tests.support import CeleryWorker, WebServer, wait_until

LEASE_S = 4.0  # the worker's AGORA_LEASE_S: a turn's, and a remote call step's

pytestmark = pytest.mark.integration

TOKEN_ENV = "AGORA_TEST_REMOTE_TOKEN"


@dataclass
class Caller:
    saga: Saga
    agent: Collaborator
    helper_url: str
    worker: CeleryWorker


def tool_result(request: dict[str, Any], call_id: str) -> Any:
    message = next(m for m in request["messages"] if m["role"] == "tool" and m["tool_call_id"] == call_id)
    return json.loads(message["content"])


def events(saga: Saga, type: str) -> list[JournalEvent]:
    return list(JournalEvent.objects.for_saga(saga.pk).filter(type=type))


def finished(collaborator: Collaborator) -> Run | None:
    run = Run.objects.get(collaborator=collaborator)
    return run if run.is_finished else None


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    server = FakeLLM()
    yield server
    server.stop()


@pytest.fixture
def start_caller(
    web_server: WebServer, cast: Cast, alice: User, fake_llm: FakeLLM, redis_url: str, artifacts: Path
) -> Iterator[Callable[..., Caller]]:
    """In a saga of its own, alice allows `helper` (the exposed responder) and `sloth` (the exposed
    agent that answers only when a test says so), and any other remote agents the test names (name
    = URL), all with the external agent's token taken from the worker's environment; then adds
    `caller`, an internal agent on the fake model, and starts the worker."""
    workers: list[CeleryWorker] = []

    def start(**more: str) -> Caller:
        saga = actions.create_saga(title="Caller", goal="Ask agents elsewhere", owner=alice)
        helper_url = cast.agent_url(web_server.url, "responder")
        actions.allow_remote_agent(saga=saga, name="helper", url=helper_url, token_env=TOKEN_ENV, by=alice)
        for name, url in more.items():  # other remote agents, by name
            actions.allow_remote_agent(saga=saga, name=name, url=url, token_env=TOKEN_ENV, by=alice)
        actions.allow_remote_agent(
            saga=saga, name="sloth", url=cast.agent_url(web_server.url, "slow"), token_env=TOKEN_ENV, by=alice
        )
        load_profiles(entries=[{"name": "caller", "role": "Caller", "model": "caller",
                                "tools": ["ask_remote_agent", "finish"]}])  # fmt: skip
        agent, _ = actions.add_agent(
            saga=saga, name="caller", role="Caller", task="Ask", runtime="internal", profile="caller", by=alice
        )
        env = {"OPENAI_BASE_URL": fake_llm.url, "OPENAI_API_KEY": "test", "OPENAI_TIMEOUT_S": "5",
               "AGORA_LEASE_S": str(LEASE_S), TOKEN_ENV: cast.ext_token}  # fmt: skip
        workers.append(CeleryWorker(redis_url, artifacts, env=env))
        return Caller(saga=saga, agent=agent, helper_url=helper_url, worker=workers[-1])

    yield start
    for worker in workers:
        worker.kill()


def test_wait_and_async_calls_make_a_real_a2a_round_trip(
    start_caller: Callable[[], Caller], fake_llm: FakeLLM, cast: Cast, web_server: WebServer
) -> None:
    helper_url = cast.agent_url(web_server.url, "responder")
    fake_llm.script(
        "caller",
        say("", tool_call("ask_remote_agent", {"agent": "helper", "message": {"n": 7}, "mode": "wait"}, "c1")),
        # The URL works as the name does when it is exactly the allowed one.
        say("", tool_call("ask_remote_agent", {"agent": helper_url, "message": "hello", "mode": "async"}, "c2")),
    )
    fake_llm.rule("caller", finish_once_answered("done", "c3", meanwhile="Waiting for helper."))
    caller = start_caller()

    run = wait_until(lambda: finished(caller.agent), timeout=90, what="the caller to finish")

    assert run.status == Run.Status.COMPLETED, run.error
    calls = fake_llm.calls_for("caller")
    waited = tool_result(calls[1], "c1")
    wait_call, async_call = RemoteCall.objects.filter(caller=caller.agent).order_by("created_at")
    assert waited["status"] == "completed" and waited["call_id"] == wait_call.pk and waited["agent"] == "helper"
    # The responder echoes the A2A message it got: our message, as a data part, under our call id.
    assert waited["reply"]["echo"]["parts"] == [{"data": {"n": 7.0}}]
    assert waited["reply"]["echo"]["message_id"] == wait_call.pk
    assert tool_result(calls[2], "c2") == {"call_id": async_call.pk, "status": "pending"}
    # The async outcome arrived once, in steering, from the remote agent.
    (item,) = SteeringItem.objects.filter(recipient=caller.agent, sender="remote:helper")
    delivered = item.payload
    assert isinstance(delivered, dict)
    assert item.kind == "response" and delivered["call_id"] == async_call.pk
    assert delivered["reply"]["echo"]["parts"] == [{"text": "hello"}]
    header = f'<<agora kind="response" from="remote:helper" call_id="{async_call.pk}" status="completed">>'
    assert calls[-1]["messages"][-1]["content"].startswith(header)

    # Each call is a request of the A2A client's principal to the responder, in the other saga.
    for call in (wait_call, async_call):
        assert call.status == RemoteCall.Status.COMPLETED and call.url == caller.helper_url
        request = AgentRequest.objects.get(pk=call.task_id)
        assert (request.saga_id, request.sender.name, request.recipient.name) == (cast.saga.pk, "ext", "responder")
        assert request.mode == "async"  # sent with returnImmediately: no web process waited for it
    assert [e.data["call_id"] for e in events(caller.saga, "remote_request")] == [wait_call.pk, async_call.pk]
    replies = events(caller.saga, "remote_reply")
    assert [(e.data["call_id"], e.data["status"]) for e in replies] == [
        (wait_call.pk, "completed"),
        (async_call.pk, "completed"),
    ]
    assert replies[0].actor == "agent:caller" and replies[0].data["task_id"] == wait_call.task_id


def test_refusals_timeouts_and_remote_failures_are_clear_tool_errors(
    start_caller: Callable[[], Caller], fake_llm: FakeLLM, cast: Cast
) -> None:
    fake_llm.script(
        "caller",
        say(
            "",
            tool_call("ask_remote_agent", {"agent": "http://elsewhere.example/a2a/x/", "message": "hi"}, "c1"),
            tool_call("ask_remote_agent", {"agent": "quiet", "message": "hi"}, "c2"),
            tool_call("ask_remote_agent", {"agent": "sloth", "message": "think", "timeout_s": 1.5}, "c3"),
        ),
        say("", tool_call("ask_remote_agent", {"agent": "sloth", "message": "think again", "timeout_s": 60}, "c4")),
        say("", tool_call("finish", {"result": "gave up"}, "c5")),
    )
    caller = start_caller()
    slow_requests = AgentRequest.objects.filter(recipient=cast.slow)

    # The second wait: the remote agent fails the task, which fails the call.
    def second_request() -> AgentRequest | None:
        open_ = slow_requests.filter(status__in=AgentRequest.OPEN)
        return next((r for r in open_ if r.payload["parts"] == [{"text": "think again"}]), None)

    request = wait_until(second_request, timeout=90, what="the second call to reach the slow agent")
    actions.reply_to_request(
        request_id=request.pk, by=cast.slow.user, error={"code": "overloaded", "message": "Too much to think about."}
    )
    run = wait_until(lambda: finished(caller.agent), timeout=60, what="the caller to finish")

    assert run.status == Run.Status.COMPLETED, run.error
    _, second, third = fake_llm.calls_for("caller")
    for call_id in ("c1", "c2"):  # not allowed: refused before anything is written or sent
        error = tool_result(second, call_id)["error"]
        assert error["code"] == "remote_not_allowed" and "allowed: helper, sloth" in error["message"]
    timed_out = tool_result(second, "c3")
    assert timed_out["status"] == "failed" and timed_out["error"]["code"] == "timeout"
    failed = tool_result(third, "c4")
    assert failed["status"] == "failed" and failed["error"]["code"] == "remote_failed"
    assert "Too much to think about." in failed["error"]["message"]

    calls = RemoteCall.objects.filter(caller=caller.agent).order_by("created_at")
    assert [c.message for c in calls] == ["think", "think again"]  # the refused ones left no row
    # Nothing reached the gateway but the two allowed calls; the timed-out task was cancelled there.
    assert slow_requests.count() == 2 and not AgentRequest.objects.filter(recipient=cast.responder).exists()
    assert slow_requests.get(pk=calls[0].task_id).status == AgentRequest.Status.CANCELLED
    assert [(e.data["status"], (e.data["error"] or {}).get("code")) for e in events(caller.saga, "remote_reply")] == [
        ("failed", "timeout"),
        ("failed", "remote_failed"),
    ]
    assert not SteeringItem.objects.filter(recipient=caller.agent, sender__startswith="remote:").exists()


def test_a_worker_killed_while_following_a_call_ends_it_once(
    start_caller: Callable[[], Caller], fake_llm: FakeLLM, cast: Cast, settings: LazySettings
) -> None:
    settings.AGORA_RERING_S = 0  # the reconciler below re-rings at once what the dead worker held
    fake_llm.script(
        "caller",
        say("", tool_call("ask_remote_agent", {"agent": "sloth", "message": "survive", "timeout_s": 120}, "c1")),
        say("", tool_call("finish", {"result": "survived"}, "c2")),
    )
    caller = start_caller()
    call = wait_until(
        lambda: RemoteCall.objects.filter(caller=caller.agent, status=RemoteCall.Status.WORKING).first(),
        timeout=90,
        what="the call to be under way",
    )
    request = AgentRequest.objects.get(pk=call.task_id)
    caller.worker.kill()  # kill -9 while it follows the remote task (its next look is scheduled)
    actions.reply_to_request(request_id=request.pk, by=cast.slow.user, payload={"answer": 42})
    caller.worker.start()

    def recovered() -> Run | None:
        reconcile()  # what beat does: ring again the steps the dead worker left
        return finished(caller.agent)

    run = wait_until(recovered, timeout=90, interval=0.5, what="the caller to recover and finish")

    assert run.status == Run.Status.COMPLETED and run.result == "survived"
    (_, last) = fake_llm.calls_for("caller")
    assert tool_result(last, "c1")["reply"] == {"answer": 42.0}
    assert AgentRequest.objects.filter(recipient=cast.slow).count() == 1  # sent once
    assert [e.data["status"] for e in events(caller.saga, "remote_reply")] == ["completed"]  # ended once


class HeldCard:
    """A front for the gateway's agent cards that holds the first one asked for until the test
    releases it (a remote agent slow to answer one step's exchange); the others pass at once. The
    card names the gateway itself as the address of the messages, so only cards pass through here."""

    def __init__(self, upstream: str) -> None:
        self.held, self.release, self.cards = threading.Event(), threading.Event(), 0
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                front.cards += 1
                if front.cards == 1:
                    front.held.set()
                    front.release.wait(timeout=60)
                answer = httpx.get(upstream + self.path, headers={"Authorization": self.headers["Authorization"]})
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers["content-type"])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_step_slower_than_its_lease_stays_with_its_live_worker(
    start_caller: Callable[..., Caller], fake_llm: FakeLLM, cast: Cast, web_server: WebServer
) -> None:
    front = HeldCard(web_server.url)
    try:
        fake_llm.script(
            "caller",
            say("", tool_call("ask_remote_agent", {"agent": "far", "message": {"n": 3}}, "c1")),
            say("", tool_call("finish", {"result": "done"}, "c2")),
        )
        caller = start_caller(far=cast.agent_url(front.url, "responder"))
        assert front.held.wait(timeout=90), "the first step's exchange never asked for the card"
        call = RemoteCall.objects.get(caller=caller.agent)
        claimed = call.lease_until
        assert claimed is not None

        def kept_past_its_first_lease() -> bool:
            reconcile()  # what beat does every few seconds: ring again a step whose lease lapsed
            held = RemoteCall.objects.get(pk=call.pk)
            now = timezone.now()
            return now > claimed + timedelta(seconds=0.3) and held.lease_until is not None and held.lease_until > now

        wait_until(kept_past_its_first_lease, timeout=3 * LEASE_S, interval=0.3, what="the lease to be renewed")
        assert front.cards == 1  # no second worker took the step and asked for the card again
        assert RemoteCall.objects.get(pk=call.pk).step == call.step
        front.release.set()
        run = wait_until(lambda: finished(caller.agent), timeout=60, what="the caller to finish")
    finally:
        front.stop()

    assert run.status == Run.Status.COMPLETED and run.result == "done"
    (_, last) = fake_llm.calls_for("caller")
    assert tool_result(last, "c1")["reply"]["echo"]["parts"] == [{"data": {"n": 3.0}}]
    assert AgentRequest.objects.filter(recipient=cast.responder).count() == 1  # sent once
    assert [e.data["status"] for e in events(caller.saga, "remote_reply")] == ["completed"]
