"""The turns of one internal run, back to back in one task.

claim → (resume a parked wait, or run the calls a parked wait left) → drain steering into the
transcript → call the model chain outside any transaction → persist its message with its tool
calls' effects and results → park, go idle, finish, or begin the next turn (in this task, or
queued for any worker once the task's time slice is used).
"""

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from agents import scripted
from agents.hooks.lifecycle import CONTEXT_HEADING
from agents.images import VISION, artifact_names, for_request, with_images
from agents.mcp import runtime as mcp
from agents.messages import distinct_call_ids, render, tool_message
from agents.models import AgentProfile
from agents.orchestrator import starts
from agents.orchestrator.models import Prompt, is_brain_worker
from agents.orchestrator.tasks import read_ahead
from agents.providers import Completion, ProviderError, once_sent, provider_for
from agents.tools import Call, execute, schemas
from agents.transcripts import Transcript, take_transcript
from config import metrics
from config.sql import await_commit, commit_unawaited, prepared
from journal.actions import record
from sagas import actions
from sagas.metrics import count_round_trip
from sagas.models import AgentRequest, Run, Team


class LostTurn(Exception):
    """The lease ran out and the run was handed to another worker: stop without writing."""


class Turns:
    """The turns of one run that one task executes, back to back.

    A turn is two transactions around the model call: the one that drains its input (which is also
    the one that concluded the previous turn, when the task goes straight on) and the one that
    stores the model's message with the effects and results of its tool calls. A crash in between
    leaves the turn to be run again from its stored input; a crash inside either rolls it back whole.
    A run with more to do keeps its worker for up to `AGORA_TURN_SLICE_S`, then goes back in line.
    """

    def __init__(self, claimed: "actions.Claimed", *, worker: str = "") -> None:
        """`claimed`: the run as _CLAIMED_RUN_SQL read it with its claim, and what it read with it."""
        self.run = run = claimed.run
        self.worker = worker
        self.collaborator = run.collaborator
        self.saga_id = self.collaborator.saga_id
        self.turn = run.turn  # as claimed
        self.slice_ends = time.monotonic() + settings.AGORA_TURN_SLICE_S
        # Read once the run is claimed: while this task holds its lease nobody else writes it.
        self.transcript = Transcript(run.pk)
        self.outside: dict[str, Any] | None = None  # an MCP call to make outside any transaction
        self.context = ""  # what a prompt's SubagentStart hooks added to this worker's task
        self.pending: starts.Pending | None = None  # those hooks, to run after the claim's commit
        self.rested: Callable[[], str | None] | None = None  # a rest's status, read after its commit
        self.go_on = False  # whether the turn start() began goes on to a model call
        # What ring_orchestrator() reads, read by the transaction that ended this task's turns
        # (read_for_orchestrator()); None when the last transaction did not end them.
        self.orchestrator_read: Callable[[], list[Prompt]] | None = None
        profile, kind, name, *self.start_read = claimed.also
        self.images = starts.prompt_images(self.start_read)  # a prompt's worker: its images, if it has any
        self.data_urls: dict[str, str] = {}  # its image artifacts, as sent (images.for_request)
        self.profile: AgentProfile | None = profile  # None: the turn fails the run (begin())
        self.mcp = mcp.RunTools(run.pk, profile.mcp_servers if profile else [])
        self.delegator = f"{kind}:{name}" if kind else ""  # who handed this run its task, if someone did
        self.transcript_ahead = claimed.ahead  # what the claim read of the transcript (transcripts.read_ahead)
        self.commit_error: Exception | None = None  # what reading a COMMIT's answer during a call raised

    # --- the shape of a turn ----------------------------------------------------------------

    def start(self) -> bool:
        """The claimed turn's start, in the claim's transaction: its transcript, then its input, or
        for a prompt's support worker with SubagentStart hooks nothing more (they run after the
        commit: execute()). False when the turn ended here."""
        self.transcript = take_transcript(self.run.pk, turn=self.turn - 1, ahead=self.transcript_ahead)
        self.pending = self.pending_start()
        go_on = self.pending is not None or self.begin()
        self.save_transcript()
        return go_on

    def execute(self, go_on: bool) -> None:
        """The turns after start(), each model call outside any transaction."""
        if self.pending is not None:
            go_on = self.start_hooks(self.pending)
        while go_on or self.steered():
            if self.outside is not None:
                go_on = self.call_outside()
                continue
            completion, latency_ms = self.call_models(self.transcript.messages)
            # Only a message with tool calls goes on to the next turn's input in this transaction.
            with self.transaction(input_next=completion is not None and bool(completion.tool_calls)):
                go_on = self.conclude(completion, latency_ms)
                if go_on and self.outside is None:
                    commit_unawaited()  # the next model call comes next

    def steered(self) -> bool:
        """After the commit of a turn that came to rest (end()): steering that came meanwhile kept
        the run with this task (`running`, its next turn under a fresh lease); that turn begins
        here, in a transaction of its own. False when the run rested."""
        while (rested := self.rested) is not None:
            self.rested = None
            if rested() != Run.Status.RUNNING:
                return False
            self.turn += 1
            with self.transaction():
                if self.begin():
                    return True
        return False

    def pending_start(self) -> "starts.Pending | None":
        """A prompt's support worker before its first input: the SubagentStart hooks it must run."""
        if self.transcript.messages or not is_brain_worker(self.collaborator.name):
            return None
        return starts.pending_start(self.saga_id, self.collaborator.name, self.start_read)

    def start_hooks(self, pending: "starts.Pending") -> bool:
        """Its SubagentStart hooks, before its first model call and outside any transaction (the
        heartbeat keeps the lease meanwhile); a block fails this worker only, with the reason."""
        start = starts.run_start(pending)
        with self.transaction():
            if start.blocked:
                self.journal("worker_start", {"role": self.collaborator.role, "task": self.collaborator.task,
                                              "worker": self.worker})  # fmt: skip
                return self.finish(Run.Status.FAILED, result={"blocked": start.blocked}, error=start.blocked)
            self.context = start.context
            return self.begin()

    @contextmanager
    def transaction(self, *, input_next: bool = True) -> Iterator[None]:
        """One of the turns' transactions after the claim's: under the saga's lock (taken first, as
        by every kernel write: one lock order, no deadlocks), first a renewal of the lease, which
        proves this task holds the turn, and last the new transcript entries. That proof is also
        what makes the saga's copy `current` (saga_transaction): its status is not read again. The
        renewal's answer is read last, before the commit (on PostgreSQL the server fails the
        transaction instead: actions.turn_lost()): nothing waits for it in between, and a turn that
        another worker took over rolls back whole. With `input_next`, a turn's input may be taken
        in it: its steering is read ahead with the renewal."""
        self.orchestrator_read = None
        try:
            with actions.saga_transaction(self.collaborator.saga, current=True):
                held = actions.prove_lease(run_id=self.run.pk, turn=self.turn)
                unread = actions.read_ahead(self.run.pk) if input_next else None
                with actions.unread_ahead(self.collaborator.pk, unread):
                    yield
                if not held():
                    raise LostTurn
                self.save_transcript()
        except (LostTurn, DatabaseError) as exc:
            if isinstance(exc, DatabaseError) and not actions.turn_lost(exc):
                raise
            metrics.turn_ended("lost")
            raise LostTurn from exc

    def begin(self) -> bool:
        """Start the turn: budgets, a parked wait's result, its input. False when the turn ended here."""
        if self.profile is None:
            return self.finish(Run.Status.FAILED, error=f"No agent profile {self.collaborator.profile!r}.")
        if self.turn - self.run.reclaims > self.profile.max_turns:  # a turn its dead worker lost is not used
            return self.finish(Run.Status.FAILED, error=f"Turn budget of {self.profile.max_turns} turns exhausted.")
        if self.run.reclaims_in_row > settings.AGORA_MAX_RECLAIMS:  # a turn that fails its task each time it is made
            times = self.run.reclaims_in_row
            why = f"Its turn was taken back {times} times in a row: a worker died or the turn failed (logged)."
            return self.finish(Run.Status.FAILED, error=why)
        if self.transcript.tokens >= self.profile.max_tokens:
            return self.finish(Run.Status.FAILED, error=f"Token budget of {self.profile.max_tokens} tokens exhausted.")
        if self.run.team_id is not None and not self.within_team_budget():
            return False
        if self.turn == 1 and not self.transcript.messages:
            self.journal(
                "worker_start", {"role": self.profile.role, "task": self.collaborator.task, "worker": self.worker}
            )
        resumed = bool(self.run.waiting_on_id) and self.resume_wait()
        resumed = resumed or (bool(self.run.waiting_on_remote_id) and self.resume_remote_wait())
        interrupted = self.interrupted_calls()
        if interrupted and self.run_calls(interrupted):
            return False
        if self.outside is not None:
            return True  # the calls' results first, then new input
        fresh = self.take_input()
        history = self.transcript.messages
        if not (fresh or resumed or interrupted) and history and history[-1]["role"] == "assistant":
            return self.end(more=False)  # nothing new to think about
        return True

    def conclude(self, completion: Completion | None, latency_ms: float) -> bool:
        """Store the model's message, run its tool calls, then end the turn or begin the next."""
        if completion is None:
            return self.finish(Run.Status.FAILED, error="Every model candidate failed.")
        distinct_call_ids(completion.tool_calls, self.transcript.messages, turn=self.turn)
        self.journal(
            "llm_call",
            {"model": completion.model, "latency_ms": latency_ms, "prompt_tokens": completion.prompt_tokens,
             "completion_tokens": completion.completion_tokens,
             "tool_calls": [c["name"] for c in completion.tool_calls], "turn": self.turn, "worker": self.worker},
        )  # fmt: skip
        self.transcript.append(
            self.turn, [completion.as_message()], tokens=completion.prompt_tokens + completion.completion_tokens
        )
        if self.run_calls(completion.tool_calls):
            return False
        if self.outside is not None:
            return True
        return self.end(more=bool(completion.tool_calls))

    def end(self, *, more: bool) -> bool:
        """End the turn; True when this task goes straight on with the next one in this
        transaction. A turn that comes to rest is not waited for: whether steering kept the run
        with this task is read after the commit (steered())."""
        carry_on = time.monotonic() < self.slice_ends
        status = actions.end_turn_later(run=self.run, turn=self.turn, more=more, carry_on=carry_on)
        self.ended(status)
        if not more:
            self.rested = status
            self.read_for_orchestrator()
            return False
        if status() != Run.Status.RUNNING:
            return False
        self.turn += 1
        return self.begin()

    def run_calls(self, calls: list[dict[str, Any]]) -> bool:
        """Run tool calls in order; True when the turn is over (the run parked or finished)."""
        assert self.profile is not None
        for index, tool_call in enumerate(calls):
            if mcp.is_mcp_call(tool_call["name"]):
                self.outside = tool_call  # made after this transaction commits what came before it
                return False
            call = Call(run=self.run, collaborator=self.collaborator, turn=self.turn, call_id=tool_call["id"])
            outcome = execute(call, tool_call["name"], tool_call["arguments"], self.profile.tools)
            if outcome.finished:
                self.finish(Run.Status.COMPLETED, result=outcome.extra.get("result"))
                return True
            if outcome.result is None:
                self.ended(actions.end_turn_later(run=self.run, turn=self.turn, more=False))
                return True
            self.transcript.append(self.turn, [tool_message(tool_call["id"], outcome.result)])
            if outcome.rests:  # the calls after it are not made, and say so (each call has its result)
                skipped = {"error": {"code": "not_run", "message": "Not made: finish ended the turn before it."}}
                self.transcript.append(self.turn, [tool_message(c["id"], skipped) for c in calls[index + 1 :]])
                self.end(more=False)
                return True
        return False

    def call_outside(self) -> bool:
        """An MCP call: made outside any transaction, then its result stored with the calls after it.

        The calls before it are committed first, so a crash during it never repeats them; the call
        itself, cut short by a crash, is made again when the run resumes.
        """
        tool_call, self.outside = self.outside, None
        assert tool_call is not None
        outcome = self.mcp.call(tool_call["name"], tool_call["arguments"])
        with self.transaction():
            if outcome.connected:
                self.journal("mcp_connect", {"servers": outcome.connected})
            self.journal("mcp_call", outcome.event)
            self.transcript.append(self.turn, [tool_message(tool_call["id"], outcome.result)])
            if self.run_calls(self.interrupted_calls()):
                return False
            return True if self.outside is not None else self.end(more=True)

    def still_active(self) -> bool:
        """Whether the run goes on with more turns (its MCP connections are kept for them)."""
        return Run.objects.filter(pk=self.run.pk, status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).exists()

    def interrupted_calls(self) -> list[dict[str, Any]]:
        """The calls of the last model message that have no result: those after a call that parked."""
        history = self.transcript.messages
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
        if not self.transcript.messages:
            messages.append({"role": "system", "content": self.system_prompt()})
            messages.append({"role": "user", "content": with_images(self.first_input(), self.images)})
        items = actions.consume_steering(recipient=self.collaborator, turn=self.turn)
        if items:
            messages.append({"role": "user", "content": "\n\n".join(render(item) for item in items)})
        self.transcript.append(self.turn, messages)
        return bool(messages)

    def system_prompt(self) -> str:
        assert self.profile is not None
        return (
            f"{self.profile.system_prompt}\n\nYou are {self.collaborator.handle} ({self.collaborator.role}) in a saga "
            "of agents and people. Messages from the engine start with a <<agora ...>> header naming the sender, "
            "the kind and the request_id. Use your tools to talk to collaborators; call finish when you are done."
        ).strip()

    def first_input(self) -> str:
        task = (
            f"{self.collaborator.task}\n\n{CONTEXT_HEADING}\n{self.context}" if self.context else self.collaborator.task
        )
        handoff = {"task": task, "role": self.collaborator.role}
        if self.delegator:
            handoff["from"] = self.delegator
        return scripted.header(kind="handoff", **{"from": self.delegator}) + "\n" + json.dumps(handoff)

    def resume_wait(self) -> bool:
        """The parked `ask_agent(mode="wait")` gets its result: the reply, or `timed_out`. The reply
        is most often among the steering read with the claim (consume_reply_ahead()): then nothing
        here waits for the database."""
        run, me = self.run, self.collaborator
        request: AgentRequest | None
        if taken := actions.consume_reply_ahead(recipient=me, request_id=run.waiting_on_id, turn=self.turn):
            request, by = taken
        else:
            request, by = Run.objects.select_related("waiting_on__recipient").get(pk=run.pk).waiting_on, ""
            if request is None:
                return False
            if not request.is_open:
                actions.consume_reply(recipient=me, request=request, turn=self.turn)
        if request.is_open:
            result: dict[str, Any] = {"request_id": request.pk, "status": "pending", "timed_out": True}
        else:
            result = actions.outcome(request, by=by)
            count_round_trip(request, at=timezone.now())
        self.transcript.append(self.turn, [tool_message(run.wait_tool_call_id, result)])
        actions.clear_wait(run=run)
        return True

    def resume_remote_wait(self) -> bool:
        """The parked `ask_remote_agent(mode="wait")` gets its result: the reply, or its error; a
        call still open past its deadline fails here with `timeout`."""
        run = Run.objects.select_related("waiting_on_remote").get(pk=self.run.pk)
        call = run.waiting_on_remote
        if call is None:
            return False
        if call.is_open:
            actions.time_out_remote_call(call)
        result = actions.remote_outcome(call)
        self.transcript.append(self.turn, [tool_message(run.wait_tool_call_id, result)])
        Run.objects.filter(pk=run.pk).update(waiting_on_remote=None, wait_tool_call_id="")
        self.run.waiting_on_remote_id = None
        return True

    # --- the model --------------------------------------------------------------------------

    def call_models(self, history: list[dict[str, Any]]) -> tuple[Completion | None, float]:
        """Each candidate in order, outside any transaction; a failed one is journaled at once and
        the next is tried. Returns the completion and its latency in milliseconds."""
        assert self.profile is not None
        if self.profile.mcp_servers:  # connecting may call out of the process
            self.committed()
        if report := self.mcp.connect():
            self.journal("mcp_connect", {"servers": report})
        tools = schemas(self.profile.tools, saga_id=self.saga_id) + self.mcp.schemas()
        if self.images:  # only a prompt's worker with images has image parts
            if artifact_names(history) - set(self.data_urls):  # a read: after the COMMIT sent before the call
                self.committed()
            history = for_request(history, saga_id=self.saga_id, found=self.data_urls)
        also = [VISION] if self.images else []
        for model in self.profile.candidates:
            if lacks := self.profile.lacks(model, also=also):
                self.journal("model_skipped", {"role": self.profile.role, "model": model, "lacks": lacks})
                continue
            started = time.perf_counter()
            try:
                with once_sent(self.commit_meanwhile):
                    completion = provider_for(model, self.profile.endpoint).complete(
                        model=model, messages=history, tools=tools
                    )
            except ProviderError as exc:
                self.committed()
                self.journal(
                    "model_fallback",
                    {"role": self.profile.role, "model": model, "error_class": exc.error_class,
                     "retryable": exc.retryable, "error": str(exc)[:500]},
                )  # fmt: skip
                continue
            latency_ms = round((time.perf_counter() - started) * 1000, 1)
            self.committed()
            return completion, latency_ms
        return None, 0.0

    def commit_meanwhile(self) -> None:
        """During a model call out of the process, once its request is out (providers.once_sent()):
        the answer to the COMMIT sent before it, read while the model works, so that the call
        starts one round trip sooner and the commit's hooks (the live view's `worker_start`) run
        without waiting for the model. What it raises is kept for committed(), after the call:
        raised inside the HTTP client, it would count as the model's failure. The call a failed
        COMMIT leaves behind is dropped there (re-running a model call is allowed; none of the
        turn's effects was made, and none is made twice)."""
        try:
            await_commit()
        except Exception as exc:  # noqa: BLE001 (kept, and raised after the call by committed())
            self.commit_error = exc

    def committed(self) -> None:
        """The answer to the COMMIT this task sent without waiting before its model call (the
        claim's, or the last turn's: config.sql.commit_unawaited), if no statement read it yet: a
        scripted model's call overlaps its round trip, a call out of the process reads it once its
        request is out (commit_meanwhile()). Before an MCP connection, which may have effects of
        its own, it is read first. A turn another worker took over in the meantime stops here, as
        in a transaction of the turn (LostTurn)."""
        error, self.commit_error = self.commit_error, None
        try:
            if error is not None:
                raise error
            await_commit()
        except DatabaseError as exc:
            if not actions.turn_lost(exc):
                raise
            metrics.turn_ended("lost")
            raise LostTurn from exc

    def save_transcript(self) -> None:
        """What the turn added to its transcript, and for a teammate the tokens it used, added to
        its team's total in the same transaction."""
        tokens = self.transcript.save()
        if self.run.team_id is not None:
            actions.count_team_tokens(team_id=self.run.team_id, tokens=tokens)

    def within_team_budget(self) -> bool:
        """A teammate's turn first asks whether its team has tokens left (one statement); if not,
        the teammate is shut down here, before any model call (`team_budget_exhausted`)."""
        with connection.cursor() as cursor:
            cursor.execute(_TEAM_TOKENS_SQL, [self.run.team_id])
            row = cursor.fetchone()
        if row is None:
            return True
        budget, used = row
        if used < budget:
            return True
        actions.stop_over_budget(run=self.run, used=used, budget=budget)
        return False

    # --- the end ----------------------------------------------------------------------------

    def finish(self, status: str, *, result: Any = None, error: str = "") -> bool:
        actions.finish_run(run=self.run, status=status, result=result, error=error, worker=self.worker)
        self.ended(lambda: status)
        self.journal("worker_end", {"status": status, "result": result, "error": error, "worker": self.worker})
        self.read_for_orchestrator()
        return False

    def read_for_orchestrator(self) -> None:
        """A prompt's worker whose run finished or came to rest: this transaction, which ends the
        task's turns (unless steering keeps the run: steered()), reads with its COMMIT what the
        orchestration's next step needs (read_ahead()): no round trip of its own."""
        if is_brain_worker(self.collaborator.name):
            self.orchestrator_read = read_ahead(self.saga_id, self.collaborator.name)

    def ended(self, status: Callable[[], str | None]) -> None:
        """Count the turn once its transaction commits, by the run's status then: `running` goes
        on in this task, None lost it."""

        def count() -> None:
            answer = status()
            metrics.turn_ended("continued" if answer == Run.Status.RUNNING else answer or "lost")

        transaction.on_commit(count, robust=True)

    # --- persistence ------------------------------------------------------------------------

    def journal(self, type: str, data: dict[str, Any]) -> None:
        record(saga_id=self.saga_id, type=type, actor=self.collaborator.handle, run_id=self.run.pk, data=data)


# A team's token budget and what its teammates have used so far (counted by their turns).
_TEAM_TOKENS_SQL = prepared(f"SELECT max_tokens, tokens_used FROM {Team._meta.db_table} WHERE id = %s")
