"""The turn executor: one turn of one internal run.

claim → (resume a parked wait, or finish tool calls a crash interrupted) → drain steering into the
transcript → call the model chain outside any transaction → persist its message → run its tool
calls → park, go idle, queue the next turn, or finish.
"""

import json
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from agents import scripted
from agents.models import AgentProfile, TranscriptEntry
from agents.providers import Completion, ProviderError, provider_for
from agents.tools import Call, Outcome, execute, schemas
from journal.actions import record
from sagas import actions
from sagas.models import AgentRequest, Run, SteeringItem

logger = logging.getLogger(__name__)


class LostTurn(Exception):
    """The lease ran out and the run was handed to another worker: stop without writing."""


class Heartbeat(threading.Thread):
    """Renews the lease while a long turn (a slow model call) runs."""

    def __init__(self, run_id: str, turn: int) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{run_id}")
        self.run_id, self.turn = run_id, turn
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(settings.AGORA_LEASE_S / 3):
                if not actions.renew_lease(run_id=self.run_id, turn=self.turn):
                    return  # taken over: the turn's next write finds out and stops (LostTurn)
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def run_turn(run_id: str) -> None:
    run = actions.claim_turn(run_id=run_id)
    if run is None:
        return  # a redelivered doorbell, or another worker holds the run
    heartbeat = Heartbeat(run.pk, run.turn)
    heartbeat.start()
    try:
        Turn(run).execute()
    except LostTurn:
        logger.info("turn %s of %s was taken over; stopping", run.turn, run.pk)
    finally:
        heartbeat.stop()
        close_old_connections()


class Turn:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.collaborator = run.collaborator
        self.saga_id = self.collaborator.saga_id
        self.turn = run.turn
        self.profile = AgentProfile.objects.filter(name=self.collaborator.profile).first()
        # The run's transcript, read once per turn and extended by append(): while this turn holds
        # the run's lease nobody else writes it, and a turn whose write fails ends with the exception.
        self.history: list[dict[str, Any]] | None = None
        self.last_seq = 0
        self.tokens = 0

    # --- the shape of a turn ----------------------------------------------------------------

    def execute(self) -> None:
        if self.profile is None:
            self.finish(Run.Status.FAILED, error=f"No agent profile {self.collaborator.profile!r}.")
            return
        if self.turn > self.profile.max_turns:
            self.finish(Run.Status.FAILED, error=f"Turn budget of {self.profile.max_turns} turns exhausted.")
            return
        if self.tokens_used() >= self.profile.max_tokens:
            self.finish(Run.Status.FAILED, error=f"Token budget of {self.profile.max_tokens} tokens exhausted.")
            return
        if self.turn == 1 and not self.transcript():
            self.journal("worker_start", {"role": self.profile.role, "task": self.collaborator.task})
        if self.run.waiting_on_id:
            self.resume_wait()
        if self.finish_interrupted_calls():
            return
        fresh = self.take_input()
        history = self.transcript()
        if not fresh and history and history[-1]["role"] == "assistant":
            actions.end_turn(run_id=self.run.pk, turn=self.turn, more=False)  # nothing new to think about
            return
        completion = self.call_models(history)
        if completion is None:
            self.finish(Run.Status.FAILED, error="Every model candidate failed.")
            return
        self.append([completion.as_message()], tokens=completion.prompt_tokens + completion.completion_tokens)
        if self.run_calls(completion.tool_calls):
            return
        actions.end_turn(run_id=self.run.pk, turn=self.turn, more=bool(completion.tool_calls))

    def run_calls(self, calls: list[dict[str, Any]]) -> bool:
        """Run tool calls in order; True when the turn is over (the run parked or finished)."""
        for tool_call in calls:
            outcome = self.run_tool(tool_call)
            if outcome.finished:
                self.finish(Run.Status.COMPLETED, result=outcome.extra.get("result"))
                return True
            if outcome.result is None:
                actions.end_turn(run_id=self.run.pk, turn=self.turn, more=False)
                return True
        return False

    def finish_interrupted_calls(self) -> bool:
        """After a crash mid-tools: run the calls of the last model message that have no result."""
        history = self.transcript()
        last = next((i for i in range(len(history) - 1, -1, -1) if history[i]["role"] == "assistant"), None)
        if last is None or not history[last].get("tool_calls"):
            return False
        answered = {m.get("tool_call_id") for m in history[last + 1 :] if m["role"] == "tool"}
        missing = [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in history[last]["tool_calls"]
            if c["id"] not in answered
        ]
        if not missing:
            return False
        if self.run_calls(missing):
            return True
        actions.end_turn(run_id=self.run.pk, turn=self.turn, more=True)
        return True

    # --- input ------------------------------------------------------------------------------

    def take_input(self) -> bool:
        """Drain steering into the transcript in one transaction (acknowledged by injection)."""
        with transaction.atomic():
            self.check_lease()
            messages: list[dict[str, Any]] = []
            if not self.transcript():
                messages.append({"role": "system", "content": self.system_prompt()})
                messages.append({"role": "user", "content": self.first_input()})
            items = actions.consume_steering(recipient=self.collaborator, turn=self.turn)
            if items:
                messages.append({"role": "user", "content": "\n\n".join(render(item) for item in items)})
            self.append(messages, leased=True)
            return bool(messages)

    def system_prompt(self) -> str:
        assert self.profile is not None
        return (
            f"{self.profile.system_prompt}\n\nYou are {self.collaborator.handle} ({self.collaborator.role}) in a saga "
            "of agents and people. Messages from the engine start with a <<agora ...>> header naming the sender, "
            "the kind and the request_id. Use your tools to talk to collaborators; call finish when you are done."
        ).strip()

    def first_input(self) -> str:
        handoff = {"task": self.collaborator.task, "role": self.collaborator.role}
        delegation = getattr(self.collaborator, "delegation", None)
        if delegation is not None:
            handoff["from"] = delegation.delegator.handle
        return scripted.header(kind="handoff", **{"from": handoff.get("from", "")}) + "\n" + json.dumps(handoff)

    def resume_wait(self) -> None:
        """The parked `ask_agent(mode="wait")` gets its result: the reply, or `timed_out`."""
        with transaction.atomic():
            self.check_lease()
            run = Run.objects.select_related("waiting_on__recipient").get(pk=self.run.pk)
            request = run.waiting_on
            assert request is not None
            if request.is_open:
                result: dict[str, Any] = {"request_id": request.pk, "status": "pending", "timed_out": True}
            else:
                result = actions.outcome(request)
                # The reply was given as this call's result; it is not rendered again from steering.
                SteeringItem.objects.filter(
                    recipient=self.collaborator, request=request, consumed_at__isnull=True
                ).update(consumed_turn=self.turn, consumed_at=request.updated_at)
            self.append([tool_message(run.wait_tool_call_id, result)], leased=True)
            Run.objects.filter(pk=run.pk).update(waiting_on=None, wait_tool_call_id="")
        self.run.waiting_on_id = None

    # --- the model --------------------------------------------------------------------------

    def call_models(self, history: list[dict[str, Any]]) -> Completion | None:
        """Each candidate in order; a failed one is journaled and the next is tried."""
        assert self.profile is not None
        tools = schemas(self.profile.tools)
        for model in self.profile.candidates:
            if self.profile.requires and not self.profile.can_run_on(model):
                self.journal(
                    "model_skipped", {"role": self.profile.role, "model": model, "lacks": self.profile.requires}
                )
                continue
            started = time.perf_counter()
            try:
                completion = provider_for(model, self.profile.endpoint).complete(
                    model=model, messages=history, tools=tools
                )
            except ProviderError as exc:
                self.journal(
                    "model_fallback",
                    {"role": self.profile.role, "model": model, "error_class": exc.error_class,
                     "retryable": exc.retryable, "error": str(exc)[:500]},
                )  # fmt: skip
                continue
            self.journal(
                "llm_call",
                {"model": model, "latency_ms": round((time.perf_counter() - started) * 1000, 1),
                 "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
                 "tool_calls": [c["name"] for c in completion.tool_calls]},
            )  # fmt: skip
            return completion
        return None

    # --- tools and the end ------------------------------------------------------------------

    def run_tool(self, tool_call: dict[str, Any]) -> Outcome:
        assert self.profile is not None
        with transaction.atomic():
            self.check_lease()
            call = Call(run=self.run, collaborator=self.collaborator, turn=self.turn, call_id=tool_call["id"])
            outcome = execute(call, tool_call["name"], tool_call["arguments"], self.profile.tools)
            if outcome.result is not None:
                self.append([tool_message(tool_call["id"], outcome.result)], leased=True)
            return outcome

    def finish(self, status: str, *, result: Any = None, error: str = "") -> None:
        with transaction.atomic():
            self.check_lease()
            actions.finish_run(run=self.run, status=status, result=result, error=error)
            self.journal("worker_end", {"status": status, "result": result, "error": error})

    # --- persistence ------------------------------------------------------------------------

    def check_lease(self) -> None:
        """Inside a transaction: take the saga's lock, as every kernel write does first (one lock
        order, no deadlocks), then make sure this worker still holds the turn."""
        actions.lock_saga(self.saga_id)
        if (
            not Run.objects.select_for_update(no_key=True)
            .filter(pk=self.run.pk, status=Run.Status.RUNNING, turn=self.turn)
            .exists()
        ):
            raise LostTurn

    def transcript(self) -> list[dict[str, Any]]:
        if self.history is None:
            rows = TranscriptEntry.objects.filter(run=self.run).order_by("seq").values_list("seq", "message", "tokens")
            self.history = []
            for seq, message, tokens in rows:
                self.history.append(message)
                self.last_seq, self.tokens = seq, self.tokens + tokens
        return list(self.history)

    def append(self, messages: list[dict[str, Any]], *, tokens: int = 0, leased: bool = False) -> None:
        """Add messages to the transcript; `leased`: the caller's transaction has checked the lease."""
        if not messages:
            return
        with transaction.atomic():
            if not leased:
                self.check_lease()
            self.transcript()
            start = self.last_seq + 1
            TranscriptEntry.objects.bulk_create(
                TranscriptEntry(run=self.run, seq=start + i, turn=self.turn, message=m, tokens=tokens if i == 0 else 0)
                for i, m in enumerate(messages)
            )
        assert self.history is not None
        self.history.extend(messages)
        self.last_seq, self.tokens = start + len(messages) - 1, self.tokens + tokens

    def tokens_used(self) -> int:
        self.transcript()
        return self.tokens

    def journal(self, type: str, data: dict[str, Any]) -> None:
        record(saga_id=self.saga_id, type=type, actor=self.collaborator.handle, run_id=self.run.pk, data=data)


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
    payload = {"error": request.error} if request is not None and request.error else item.payload
    return scripted.header(**attrs) + "\n" + json.dumps(payload, ensure_ascii=False)
