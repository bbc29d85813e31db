"""The turn executor: the turns of one internal run, back to back in one task.

claim → (resume a parked wait, or run the calls a parked wait left) → drain steering into the
transcript → call the model chain outside any transaction → persist its message with its tool
calls' effects and results → park, go idle, finish, or begin the next turn (in this task, or
queued for any worker once the task's time slice is used).
"""

import json
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import connection

from agents import scripted
from agents.models import AgentProfile, TranscriptEntry
from agents.providers import Completion, ProviderError, provider_for
from agents.tools import Call, execute, schemas
from journal.actions import record
from sagas import actions
from sagas.models import AgentRequest, Run, SteeringItem

logger = logging.getLogger(__name__)


class LostTurn(Exception):
    """The lease ran out and the run was handed to another worker: stop without writing."""


class Heartbeat(threading.Thread):
    """Renews the lease while a long turn (a slow model call) runs, following the turn number as
    the task goes from one turn to the next."""

    def __init__(self, turns: "Turns") -> None:
        super().__init__(daemon=True, name=f"heartbeat-{turns.run.pk}")
        self.turns = turns
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(settings.AGORA_LEASE_S / 3):
                turn = self.turns.turn
                if not actions.renew_lease(run_id=self.turns.run.pk, turn=turn) and turn == self.turns.turn:
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
    turns = Turns(run)
    heartbeat = Heartbeat(turns)
    heartbeat.start()
    try:
        turns.execute()
    except LostTurn:
        logger.info("turn %s of %s was taken over; stopping", turns.turn, run.pk)
    finally:
        heartbeat.stop()
        if connection.errors_occurred:  # the next task starts on a fresh connection
            connection.close()


class Turns:
    """The turns of one run that one task executes, back to back.

    A turn is two transactions around the model call: the one that drains its input (which is also
    the one that concluded the previous turn, when the task goes straight on) and the one that
    stores the model's message with the effects and results of its tool calls. A crash in between
    leaves the turn to be run again from its stored input; a crash inside either rolls it back whole.
    A run with more to do keeps its worker for up to `AGORA_TURN_SLICE_S`, then goes back in line.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self.collaborator = run.collaborator
        self.saga_id = self.collaborator.saga_id
        self.turn = run.turn
        self.profile = AgentProfile.objects.filter(name=self.collaborator.profile).first()
        self.slice_ends = time.monotonic() + settings.AGORA_TURN_SLICE_S
        # The run's transcript, read once and extended by append(): while this task holds the
        # run's lease nobody else writes it, and a task whose write fails ends with the exception.
        self.history: list[dict[str, Any]] | None = None
        self.last_seq = 0
        self.tokens = 0

    # --- the shape of a turn ----------------------------------------------------------------

    def execute(self) -> None:
        with actions.saga_transaction(self.saga_id):
            self.check_lease()
            go_on = self.begin()
        while go_on:
            completion, latency_ms = self.call_models(self.transcript())
            with actions.saga_transaction(self.saga_id):
                self.check_lease()
                go_on = self.conclude(completion, latency_ms)

    def begin(self) -> bool:
        """Start the turn: budgets, a parked wait's result, its input. False when the turn ended here."""
        if self.profile is None:
            return self.finish(Run.Status.FAILED, error=f"No agent profile {self.collaborator.profile!r}.")
        if self.turn > self.profile.max_turns:
            return self.finish(Run.Status.FAILED, error=f"Turn budget of {self.profile.max_turns} turns exhausted.")
        if self.tokens_used() >= self.profile.max_tokens:
            return self.finish(Run.Status.FAILED, error=f"Token budget of {self.profile.max_tokens} tokens exhausted.")
        if self.turn == 1 and not self.transcript():
            self.journal("worker_start", {"role": self.profile.role, "task": self.collaborator.task})
        resumed = bool(self.run.waiting_on_id) and self.resume_wait()
        interrupted = self.interrupted_calls()
        if interrupted and self.run_calls(interrupted):
            return False
        fresh = self.take_input()
        history = self.transcript()
        if not (fresh or resumed or interrupted) and history and history[-1]["role"] == "assistant":
            return self.end(more=False)  # nothing new to think about
        return True

    def conclude(self, completion: Completion | None, latency_ms: float) -> bool:
        """Store the model's message, run its tool calls, then end the turn or begin the next."""
        if completion is None:
            return self.finish(Run.Status.FAILED, error="Every model candidate failed.")
        self.journal(
            "llm_call",
            {"model": completion.model, "latency_ms": latency_ms, "prompt_tokens": completion.prompt_tokens,
             "completion_tokens": completion.completion_tokens,
             "tool_calls": [c["name"] for c in completion.tool_calls]},
        )  # fmt: skip
        self.append([completion.as_message()], tokens=completion.prompt_tokens + completion.completion_tokens)
        if self.run_calls(completion.tool_calls):
            return False
        return self.end(more=bool(completion.tool_calls))

    def end(self, *, more: bool) -> bool:
        """End the turn; True when this task goes straight on with the next one."""
        carry_on = time.monotonic() < self.slice_ends
        status = actions.end_turn(run=self.run, turn=self.turn, more=more, carry_on=carry_on)
        if status != Run.Status.RUNNING:
            return False
        self.turn += 1
        return self.begin()

    def run_calls(self, calls: list[dict[str, Any]]) -> bool:
        """Run tool calls in order; True when the turn is over (the run parked or finished)."""
        assert self.profile is not None
        for tool_call in calls:
            call = Call(run=self.run, collaborator=self.collaborator, turn=self.turn, call_id=tool_call["id"])
            outcome = execute(call, tool_call["name"], tool_call["arguments"], self.profile.tools)
            if outcome.finished:
                self.finish(Run.Status.COMPLETED, result=outcome.extra.get("result"))
                return True
            if outcome.result is None:
                actions.end_turn(run=self.run, turn=self.turn, more=False)
                return True
            self.append([tool_message(tool_call["id"], outcome.result)])
        return False

    def interrupted_calls(self) -> list[dict[str, Any]]:
        """The calls of the last model message that have no result: those after a call that parked."""
        history = self.transcript()
        last = next((i for i in range(len(history) - 1, -1, -1) if history[i]["role"] == "assistant"), None)
        if last is None or not history[last].get("tool_calls"):
            return []
        answered = {m.get("tool_call_id") for m in history[last + 1 :] if m["role"] == "tool"}
        return [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in history[last]["tool_calls"]
            if c["id"] not in answered
        ]

    # --- input ------------------------------------------------------------------------------

    def take_input(self) -> bool:
        """Drain steering into the transcript (acknowledged by injection: same transaction)."""
        messages: list[dict[str, Any]] = []
        if not self.transcript():
            messages.append({"role": "system", "content": self.system_prompt()})
            messages.append({"role": "user", "content": self.first_input()})
        items = actions.consume_steering(recipient=self.collaborator, turn=self.turn)
        if items:
            messages.append({"role": "user", "content": "\n\n".join(render(item) for item in items)})
        self.append(messages)
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

    def resume_wait(self) -> bool:
        """The parked `ask_agent(mode="wait")` gets its result: the reply, or `timed_out`."""
        run = Run.objects.select_related("waiting_on__recipient").get(pk=self.run.pk)
        request = run.waiting_on
        if request is None:
            return False
        if request.is_open:
            result: dict[str, Any] = {"request_id": request.pk, "status": "pending", "timed_out": True}
        else:
            result = actions.outcome(request)
            # The reply was given as this call's result; it is not rendered again from steering.
            SteeringItem.objects.filter(recipient=self.collaborator, request=request, consumed_at__isnull=True).update(
                consumed_turn=self.turn, consumed_at=request.updated_at
            )
        self.append([tool_message(run.wait_tool_call_id, result)])
        Run.objects.filter(pk=run.pk).update(waiting_on=None, wait_tool_call_id="")
        self.run.waiting_on_id = None
        return True

    # --- the model --------------------------------------------------------------------------

    def call_models(self, history: list[dict[str, Any]]) -> tuple[Completion | None, float]:
        """Each candidate in order, outside any transaction; a failed one is journaled at once and
        the next is tried. Returns the completion and its latency in milliseconds."""
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
            return completion, round((time.perf_counter() - started) * 1000, 1)
        return None, 0.0

    # --- the end ----------------------------------------------------------------------------

    def finish(self, status: str, *, result: Any = None, error: str = "") -> bool:
        actions.finish_run(run=self.run, status=status, result=result, error=error)
        self.journal("worker_end", {"status": status, "result": result, "error": error})
        return False

    # --- persistence ------------------------------------------------------------------------

    def check_lease(self) -> None:
        """First in each transaction, under the saga's lock (taken first, as by every kernel write:
        one lock order, no deadlocks): renew the lease, which proves this task still holds it."""
        if not actions.renew_lease(run_id=self.run.pk, turn=self.turn):
            raise LostTurn

    def transcript(self) -> list[dict[str, Any]]:
        if self.history is None:
            rows = TranscriptEntry.objects.filter(run=self.run).order_by("seq").values_list("seq", "message", "tokens")
            self.history = []
            for seq, message, tokens in rows:
                self.history.append(message)
                self.last_seq, self.tokens = seq, self.tokens + tokens
        return self.history

    def append(self, messages: list[dict[str, Any]], *, tokens: int = 0) -> None:
        """Add messages to the transcript, in the caller's transaction (which checked the lease)."""
        if not messages:
            return
        history = self.transcript()
        start = self.last_seq + 1
        TranscriptEntry.objects.bulk_create(
            TranscriptEntry(run=self.run, seq=start + i, turn=self.turn, message=m, tokens=tokens if i == 0 else 0)
            for i, m in enumerate(messages)
        )
        history.extend(messages)
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
