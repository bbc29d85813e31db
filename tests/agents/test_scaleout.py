"""Scale-out: two worker hosts that share only PostgreSQL and Redis over the network, the web process
and the reconciler beside them, agents whose turns land on both hosts, and one host killed with
SIGKILL in the middle of turns. Every request is answered exactly once and every saga's journal
is gap-free.

Each host is a network namespace with its own hostname where the machine allows it (root, `ip
netns`), else a separate process with its own node name and data dir (tests/worker_hosts.py);
which one ran is recorded as the test's `worker_hosts` property and printed. PostgreSQL only: on
SQLite the database is one file on one host, so there is nothing to scale out to."""

import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connection

from accounts.models import User
from agents.actions import load_profiles
from agents.scripted import parse_items
from config.celery import app as celery_app
from journal.models import JournalEvent
from sagas import actions
from sagas.models import AgentRequest, Collaborator, Run, Saga, SteeringItem
from tests.agents.fake_llm import GATE, FakeLLM, Reply, say, tool_call
from tests.sagas.api_http import Http
from tests.support import CeleryBeat, WebServer, shared_database_url, wait_until
from tests.worker_hosts import NETNS, WorkerHosts

pytestmark = [
    pytest.mark.integration,
    pytest.mark.postgres,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="scale-out runs on PostgreSQL (CI's DATABASE_URL run): SQLite is one file on one host",
    ),
]

MODEL = "scale-model"
SAGAS, RESPONDERS = 2, 3  # six agents: more turns than the two hosts' four pool processes
SLOTS = 4  # two hosts, WORKER_CONCURRENCY=2 each


def answer_every_request(body: dict[str, Any]) -> Reply:
    """The model: reply to each request in the conversation not replied to yet, else rest."""
    asked: list[tuple[str, Any]] = []
    answered: set[str] = set()
    for message in body["messages"]:
        if message["role"] == "user" and isinstance(message.get("content"), str):
            asked += [(a["request_id"], p) for a, p in parse_items(message["content"]) if a.get("kind") == "request"]
        for call in message.get("tool_calls") or []:
            if call["function"]["name"] == "reply":
                answered.add(json.loads(call["function"]["arguments"])["request_id"])
    calls = [
        tool_call("reply", {"request_id": rid, "payload": {"answer": payload["n"]}}, f"reply-{rid}")
        for rid, payload in asked
        if rid not in answered
    ]
    return say("", *calls) if calls else say("Everything asked is answered.")


@pytest.fixture
def hosts(transactional_db: None, fake_llm: FakeLLM, redis_url: str, artifacts: Path) -> Iterator[WorkerHosts]:
    servers = [urlsplit(shared_database_url()).port or 5432, urlsplit(redis_url).port, urlsplit(fake_llm.url).port]
    started = WorkerHosts(2, artifacts, ports=[port for port in servers if port])
    try:
        yield started
    finally:
        started.close()


def cast(alice: User) -> tuple[list[Saga], list[str], list[Collaborator]]:
    """Two sagas, each with an external client agent and three internal responders: (sagas, the
    clients' tokens, the responders). The responders' first turns are queued as they are added."""
    load_profiles(entries=[{"name": "scale-responder", "role": "Responder", "model": MODEL, "tools": ["reply"]}])
    sagas, tokens, responders = [], [], []
    for s in range(SAGAS):
        saga = actions.create_saga(title=f"Scale-out {s}", goal="Answer every request once", owner=alice)
        _, token = actions.add_agent(saga=saga, name="client", role="Client", task="Ask", runtime="external", by=alice)
        assert token is not None
        for r in range(RESPONDERS):
            responder, _ = actions.add_agent(
                saga=saga, name=f"r{r}", role="Responder", task="Answer", runtime="internal",
                profile="scale-responder", by=alice,
            )  # fmt: skip
            responders.append(responder)
        sagas.append(saga)
        tokens.append(token)
    return sagas, tokens, responders


def ask_each(clients: list[Http], sagas: list[Saga], responders: list[Collaborator], wave: int) -> dict[str, int]:
    """Each client asks each responder of its saga once, through the web process: {request id: n}."""
    asked: dict[str, int] = {}
    for client, saga in zip(clients, sagas, strict=True):
        for responder in (r for r in responders if r.saga_id == saga.pk):
            n = wave * 100 + len(asked)
            request_id = client.post(
                f"/api/v1/sagas/{saga.pk}/requests/",
                {"to": responder.handle, "type": "scale.ask", "payload": {"n": n}},
                headers={"Idempotency-Key": f"wave{wave}-{responder.handle}"},
            ).ok(202)["request_id"]
            asked[request_id] = n
    return asked


def steering_reader(clients: list[Http]) -> tuple[list[dict[str, Any]], Callable[[float], None]]:
    """Every item the clients' steering shows, and a function that reads more (long-polls, acknowledging)."""
    seen: list[dict[str, Any]] = []
    cursors = [0] * len(clients)

    def read(wait: float) -> None:
        for i, client in enumerate(clients):
            items = client.get(f"/api/v1/steering/?after={cursors[i]}&wait={wait}").ok(200)["items"]
            seen.extend(items)
            cursors[i] = max([cursors[i], *(int(item["seq"]) for item in items)])

    return seen, read


def test_two_worker_hosts_one_killed_mid_turn_every_request_is_answered_once_and_the_journal_has_no_gap(
    hosts: WorkerHosts, fake_llm: FakeLLM, alice: User, redis_url: str, artifacts: Path,
    record_property: Callable[[str, object], None],
) -> None:  # fmt: skip
    record_property("worker_hosts", hosts.mode)
    (artifacts / "worker-hosts.txt").write_text(hosts.describe() + "\n")
    print(hosts.describe())
    if hosts.mode != NETNS:
        warnings.warn(f"scale-out ran without network namespaces: {hosts.unavailable}", stacklevel=1)
    fake_llm.rule(MODEL, answer_every_request)
    # Production's lease (6 s) and reconcile interval (2 s): nothing here shortens them.
    env = {"OPENAI_BASE_URL": fake_llm.url, "OPENAI_API_KEY": "test", "OPENAI_TIMEOUT_S": "60"}
    a, b = hosts.hosts
    for host in hosts.hosts:
        host.start(redis_url, env)
    beat = web = None
    try:
        web = WebServer(redis_url, artifacts)
        beat = CeleryBeat(redis_url, artifacts)
        wait_until(lambda: all(h.answers(celery_app) for h in hosts.hosts), timeout=60, interval=0.2,
                   what="both worker hosts to answer")  # fmt: skip
        sagas, tokens, responders = cast(alice)
        runs = Run.objects.filter(collaborator__in=responders)
        wait_until(lambda: runs.filter(status=Run.Status.IDLE).count() == len(responders), timeout=60,
                   what="the responders' first turns")  # fmt: skip
        clients = [Http(web.url, token) for token in tokens]
        seen, read_steering = steering_reader(clients)

        # Wave 1: six requests, six turns, and the model holds the first four calls: each host's two
        # pool processes are then in the middle of a turn, so turns have landed on both hosts.
        calls_before = len(fake_llm.calls_for(MODEL))
        fake_llm.script(MODEL, *[GATE] * SLOTS)
        asked = ask_each(clients, sagas, responders, wave=1)

        def both_hosts_mid_turn() -> Counter[str] | None:
            if len(fake_llm.calls_for(MODEL)) - calls_before < SLOTS:
                return None
            running = Counter(runs.filter(status=Run.Status.RUNNING).values_list("worker", flat=True))
            return running if sum(running.values()) == SLOTS else None

        running = wait_until(both_hosts_mid_turn, timeout=60, what="four turns in their model calls")
        held_by_a = set(runs.filter(status=Run.Status.RUNNING, worker=a.node).values_list("pk", flat=True))
        a.kill()  # host a dies with two turns in flight
        fake_llm.gate.set()  # b's two calls answer; a's answers go nowhere
        asked |= ask_each(clients, sagas, responders, wave=2)

        def all_answered() -> bool:
            read_steering(1)
            return {i["request_id"] for i in seen if i["kind"] == "response"} >= set(asked)

        wait_until(all_answered, timeout=60, interval=0, what="a response to every request in the clients' steering")
        wait_until(lambda: runs.filter(status=Run.Status.IDLE).count() == len(responders), timeout=30,
                   what="every responder at rest")  # fmt: skip
        read_steering(0)  # whatever came after the last response (a duplicate would)
    finally:
        for service in (beat, web):
            if service is not None:
                service.stop()
        for host in hosts.hosts:
            host.kill()

    assert running == Counter({a.node: 2, b.node: 2}), "turns landed on both hosts, two each"
    assert len(held_by_a) == 2
    # The lease of each turn a held lapsed, and b took it over; no turn of b's was reclaimed.
    reclaimed = JournalEvent.objects.filter(saga__in=sagas, type="run.reclaimed")
    assert sorted(str(e.run_id) for e in reclaimed) == sorted(str(pk) for pk in held_by_a)
    assert {e.data["lost_by"] for e in reclaimed} == {a.node}
    assert set(Run.objects.filter(pk__in=held_by_a).values_list("worker", flat=True)) == {b.node}

    # Every request answered exactly once, with its own answer: in the database, in the journal,
    # and in what the clients read through the web process.
    requests = AgentRequest.objects.filter(saga__in=sagas)
    assert {r.pk: (r.status, r.reply) for r in requests} == {
        rid: (AgentRequest.Status.COMPLETED, {"answer": n}) for rid, n in asked.items()
    }
    responses = Counter(i["request_id"] for i in seen if i["kind"] == "response")
    assert responses == Counter(set(asked)), "each request's response reached its client once"
    stored = SteeringItem.objects.filter(request__in=requests, kind=SteeringItem.Kind.RESPONSE)
    assert Counter(stored.values_list("request_id", flat=True)) == Counter(set(asked))
    completed = JournalEvent.objects.filter(saga__in=sagas, type="request.completed")
    assert Counter(e.data["request_id"] for e in completed) == Counter(set(asked))

    for saga in sagas:
        seqs = list(JournalEvent.objects.filter(saga=saga).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1)), f"saga {saga.pk}'s journal has a gap"
