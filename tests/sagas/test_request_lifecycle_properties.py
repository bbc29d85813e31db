"""A property-based test of the request lifecycle: hypothesis drives random sequences of send,
deliver, reply, cancel, wait timeout, TTL expiry, finish and redelivery through the real kernel
actions (external agents, so no worker), and after every step checks DESIGN.md §3:

- the saga's journal seq is gap-free and ordered (§3.2);
- each request is where the lifecycle says it is, and a terminal state is final: exactly one
  terminal transition, journaled once, with its wait edge gone (§3.8, §5);
- a pending request's item is unread in its recipient's steering, a delivered one's is read (§3.4);
- a redelivered send with the same idempotency key returns the first request and adds nothing (§3.7).
"""

from typing import Any

import pytest
from django.conf import LazySettings
from django.conf import settings as django_settings
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from accounts.models import User
from journal.models import JournalEvent
from sagas import actions, errors
from sagas.models import AgentRequest, Saga, SteeringItem
from tests.sagas.conftest import build_team
from tests.sagas.kernel import Clock

Status = AgentRequest.Status
TERMINAL = {Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.EXPIRED, Status.RECIPIENT_UNAVAILABLE}
TTL_S = 1000.0
WAIT_S = 5.0
# Who may address whom under `tree`, along the delegation chain lead → coder → tester. Waits go
# down the chain only, so that no wait closes a cycle (deadlock refusals are tested elsewhere).
PAIRS = [("lead", "coder"), ("coder", "lead"), ("coder", "tester"), ("tester", "coder")]
WAITS = {("lead", "coder"), ("coder", "tester")}


class RequestLifecycle(RuleBasedStateMachine):
    owner: User
    clock: Clock
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.status: dict[str, str] = {}
        self.sent: dict[str, dict[str, Any]] = {}
        self.hops: dict[str, int] = {}
        self.finished: set[str] = set()
        self.keys = 0

    @initialize()
    def start(self) -> None:
        tree = [("lead", None), ("coder", "lead"), ("tester", "coder")]
        self.team = build_team(owner=self.owner, tree=tree)
        self.saga: Saga = self.team.saga

    # --- steps ----------------------------------------------------------------------------

    @rule(target=requests, pair=st.sampled_from(PAIRS), wait=st.booleans(), n=st.integers(0, 3))
    def send(self, pair: tuple[str, str], wait: bool, n: int) -> Any:
        sender, to = pair
        if sender in self.finished:
            return None  # a finished agent sends nothing (it no longer runs)
        self.keys += 1
        body: dict[str, Any] = {"to": f"agent:{to}", "type": "task.do", "payload": {"n": n},
                "mode": "wait" if wait and pair in WAITS else "async", "timeout_s": WAIT_S}  # fmt: skip
        key = f"k{self.keys}"
        # Its hop: one more than the deepest of the open requests its sender was asked.
        to_me = f"agent:{sender}"
        asked = [
            r for r, status in self.status.items() if status not in TERMINAL and self.sent[r]["body"]["to"] == to_me
        ]
        hop = 1 + max((self.hops[r] for r in asked), default=0)
        count = AgentRequest.objects.count()
        try:
            request, created = actions.ask_agent(sender=self.team[sender], idempotency_key=key, **body)
        except errors.RecipientUnavailable:
            assert to in self.finished and AgentRequest.objects.count() == count
            return None
        except errors.HopLimit:
            assert hop > django_settings.AGORA_MAX_HOPS and AgentRequest.objects.count() == count
            return None
        assert created and to not in self.finished and request.hop == hop <= django_settings.AGORA_MAX_HOPS
        self.hops[request.pk] = hop
        self.status[request.pk] = Status.PENDING
        self.sent[request.pk] = {"sender": sender, "key": key, "body": body}
        return request.pk

    @rule(request_id=requests)
    def deliver(self, request_id: str | None) -> None:
        """The recipient of a request reads its steering (what an external agent's poll does)."""
        if request_id is None:
            return
        to = self.sent[request_id]["body"]["to"]
        actions.consume_steering(recipient=self.team[to.removeprefix("agent:")])
        for other, status in self.status.items():
            if status == Status.PENDING and self.sent[other]["body"]["to"] == to:
                self.status[other] = Status.DELIVERED

    @rule(request_id=requests, fail=st.booleans())
    def reply(self, request_id: str | None, fail: bool) -> None:
        if request_id is None:
            return
        recipient = self.team.user(self.sent[request_id]["body"]["to"].removeprefix("agent:"))
        answer = {"error": {"code": "nope", "message": "no"}} if fail else {"payload": {"ok": True}}
        try:
            actions.reply_to_request(request_id=request_id, by=recipient, **answer)
        except errors.KernelError:
            assert self.status[request_id] in TERMINAL
            return
        assert self.status[request_id] not in TERMINAL
        self.status[request_id] = Status.FAILED if fail else Status.COMPLETED

    @rule(request_id=requests)
    def cancel(self, request_id: str | None) -> None:
        if request_id is None:
            return
        try:
            actions.cancel_request(request_id=request_id, by=self.team.user(self.sent[request_id]["sender"]))
        except errors.KernelError:
            assert self.status[request_id] in TERMINAL - {Status.CANCELLED}
            return
        if self.status[request_id] not in TERMINAL:
            self.status[request_id] = Status.CANCELLED
        assert self.status[request_id] == Status.CANCELLED  # cancelling twice is fine

    @rule(request_id=requests)
    def redeliver(self, request_id: str | None) -> None:
        if request_id is None:
            return
        sent = self.sent[request_id]
        count = AgentRequest.objects.count()
        again, created = actions.ask_agent(
            sender=self.team[sent["sender"]], idempotency_key=sent["key"], **sent["body"]
        )
        assert (again.pk, created, AgentRequest.objects.count()) == (request_id, False, count)

    @rule()
    def wait_times_out(self) -> None:
        """The reconciler's pass once the wait deadlines are over: the request stays as it was."""
        self.clock.advance(WAIT_S + 1)
        for request_id in list(actions.due_wait_ids(timezone.now())):
            actions.end_wait(request_id=request_id)

    @precondition(lambda self: self.status)
    @rule()
    def ttl_passes(self) -> None:
        self.clock.advance(TTL_S + 1)
        # The reconciler takes at most 500 a pass; the examples of one test share its database.
        while due := list(actions.due_expiry_ids(timezone.now())):
            assert all([actions.expire_request(request_id=request_id) for request_id in due])
        for request_id, status in self.status.items():
            if status not in TERMINAL:
                self.status[request_id] = Status.EXPIRED

    @rule(agent=st.sampled_from(["lead", "coder", "tester"]))
    def finish(self, agent: str) -> None:
        if agent in self.finished:
            return
        actions.set_external_status(run_id=self.team.run(agent).pk, status="finished", by=self.team.user(agent))
        self.finished.add(agent)
        for request_id, status in self.status.items():
            if status not in TERMINAL and self.sent[request_id]["body"]["to"] == f"agent:{agent}":
                self.status[request_id] = Status.RECIPIENT_UNAVAILABLE

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def journal_is_gap_free(self) -> None:
        seqs = list(JournalEvent.objects.filter(saga=self.saga).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))

    @invariant()
    def requests_are_where_the_lifecycle_says(self) -> None:
        rows = {r.pk: r for r in AgentRequest.objects.filter(saga=self.saga)}
        assert {pk: r.status for pk, r in rows.items()} == self.status
        terminal_events: dict[str, int] = {}
        for data in JournalEvent.objects.filter(
            saga=self.saga, type__in=[f"request.{s}" for s in TERMINAL]
        ).values_list("data", flat=True):
            terminal_events[data["request_id"]] = terminal_events.get(data["request_id"], 0) + 1
        for pk, request in rows.items():
            assert terminal_events.get(pk, 0) == (1 if request.status in TERMINAL else 0), pk
            if request.status in TERMINAL:
                assert request.wait_deadline is None
            item = SteeringItem.objects.get(request=request, kind=SteeringItem.Kind.REQUEST)
            if request.status == Status.PENDING:
                assert item.consumed_at is None
            elif request.status == Status.DELIVERED:
                assert item.consumed_at is not None


def test_the_request_lifecycle_keeps_the_kernels_promises(
    db: None, alice: User, bob: User, clock: Clock, settings_: LazySettings
) -> None:
    settings_.AGORA_REQUEST_TTL_S = TTL_S
    RequestLifecycle.owner, RequestLifecycle.clock = alice, clock
    run_state_machine_as_test(
        RequestLifecycle,
        settings=settings(
            max_examples=25, stateful_step_count=15, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )  # fmt: skip


@pytest.fixture
def settings_(settings: LazySettings) -> LazySettings:
    """pytest-django's `settings`, renamed: hypothesis's `settings` is imported here."""
    return settings
