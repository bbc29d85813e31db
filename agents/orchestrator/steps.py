"""The orchestration as a durable state machine on the Prompt row:

    routing → workers → primary → review → done

Each step reads what it needs, calls models outside any transaction (only the router is called
here; workers, the primary and the reviewer are delegations whose turns the executor runs), then
moves the prompt on with a compare-and-set on its step, in the same saga transaction that creates
the next delegations and journals the step. A step that finds its work unfinished returns; a step
run twice (two doorbells, a redelivery after kill -9) loses the compare-and-set and writes nothing,
so no second set of delegations is ever created and no finished worker runs again.

Lifecycle hooks wrap the steps, always before the step's transaction (a handler may take its whole
timeout): SessionStart, reference expansion and UserPromptSubmit before routing, SubagentStop once
a worker's result is in, Stop before the prompt ends. SubagentStart runs in each support worker's
own task, before its first model call (`starts`), so that the workers' hooks run side by side.
Each run is keyed (`hook_key`), so a step run again finds the finished handlers stored, and a
step holds a lease while its hooks run, so that none runs twice at once (`hooking`).
"""

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from django.utils import timezone

from agents import references
from agents.hooks import Event, PreparedPrompt, prepare_prompt
from agents.images import ARTIFACT
from agents.mcp import runtime as mcp
from agents.models import profile_named
from agents.orchestrator import handoffs, plans, router
from agents.orchestrator.actions import check_images
from agents.orchestrator.hooking import claim_routing, hold_for_hooks, release_step, stop_feedback, subagent_stop
from agents.orchestrator.models import Prompt
from agents.orchestrator.reads import Outcome, at_work_under, outcomes, read_prompt
from config.sql import failed_with, update
from journal.actions import record
from sagas import actions, errors
from sagas.models import Collaborator, Run

if TYPE_CHECKING:
    from agents.turns import Turns

logger = logging.getLogger(__name__)
Step = Prompt.Step

SUPPORT_EXPECTED = "A WorkerResult JSON object: progress, summary, artifacts, risks, next_questions."
REVIEW_EXPECTED = "A review JSON object: decision, confidence, findings, required_changes, blocking_issues."


def advance(prompt_id: str, read: Prompt | None = None, *, worker: str = "") -> "list[Turns]":
    """Move the prompt through every step that is ready now (`read`: the prompt, just read by the
    caller, for the first step). Returns the runs a step created for the caller to run at once, in
    this task, rather than through one more Celery hand-off (one per step: the first support
    worker, the primary, the reviewer), claimed for `worker` (this task's node name) and started
    in the step's transaction (see `start`)."""
    here = Here(worker)
    for _ in range(len(Step)):
        prompt, read = read or read_prompt(prompt_id), None
        if prompt is None or prompt.step == Step.DONE or prompt.lead is None:
            break
        handed = len(here)
        if not take_step(prompt, here) or len(here) > handed or prompt.step == Step.DONE:
            break  # unready, done, or it handed back a run the next step waits for: nothing more to do now
    return here


def take_step(prompt: Prompt, here: "Here") -> bool:
    """The prompt's next step; False when its work is unfinished, or when another task moved the
    prompt first (move()): then this step's transaction wrote nothing.

    A step that the kernel refuses (a delegation over the saga's caps, the saga finished meanwhile)
    or that raises for any other reason but the database's fails the prompt with the reason, rather
    than leaving it running for the periodic resume to try the same again forever. A database error
    is raised: the task's retry or the resume tries the step again."""
    step, handed = prompt.step, len(here)
    try:
        if prompt.saga.is_finished:  # its workers were ended with the saga; no step may start more
            fail(prompt, step, f"The saga was {prompt.saga.status}.")
            return False
        return STEPS[step](prompt, here)
    except Exception as exc:
        del here[handed:]  # claimed in the transaction that rolled back
        if isinstance(exc, DatabaseError):
            if not moved_first(exc):
                release_step(prompt, step)  # its retry takes the step at once
                raise
            return False
        if isinstance(exc, errors.KernelError):
            return fail(prompt, step, f"The {step} step was refused: {exc.detail}")
        logger.exception("prompt %s: the %s step failed", prompt.pk, step)
        return fail(prompt, step, f"The {step} step failed ({type(exc).__name__}); the worker's log has the details.")


# --- the steps -----------------------------------------------------------------------------------


def route(prompt: Prompt, here: "Here") -> bool:
    brain = prompt.brain
    if not claim_routing(prompt):
        return False  # another task is routing (or running hooks); a lapsed lease (a killed worker) frees it
    try:
        entry = prepare_prompt(
            saga=prompt.saga,
            user=prompt.submitted_by,
            prompt_id=prompt.pk,
            text=prompt.text,
            brain=brain.name,
            hooked=prompt.hooked_events,
        )
    except (errors.NotFound, errors.InvalidPayload) as exc:
        # Checked at submission; an artifact deleted or a saga hidden since then ends it here.
        return fail(prompt, Step.ROUTING, f"The prompt's references: {exc.detail}")
    if entry.blocked:
        return end_blocked(prompt, entry)
    prompt.expanded = text = entry.text
    images = [*prompt.images, *(f"{ARTIFACT}{name}" for name in entry.images)]
    seeing = check_images(prompt.images, list(entry.images), brain, prompt.team)  # refused: take_step fails it
    if prompt.is_team:
        plan = plans.forced_plan(prompt.team)
    else:
        routing = plans.Routing.of(brain, allowed=seeing)
        fallback = plans.heuristic_plan(text, routing)
        answer, error = router.ask_router(
            profile_name=brain.planner_profile,
            text=plans.router_prompt(text, routing, has_images=bool(images)),
            saga_id=prompt.saga_id,
            actor=handle(prompt),
            images=images,
        )
        plan = plans.normalize_router_decision(answer, routing, fallback, error=error)
        if seeing is not None and not routing.review_role and review_wanted(brain, text):
            plan["review_skipped"] = f"The {brain.review_role} role cannot see the prompt's images."
    if images:  # every worker of the prompt gets them, and runs only on models that can see them
        plan["images"] = images
    with actions.saga_transaction(prompt.saga):
        if not move(prompt, Step.ROUTING, Step.WORKERS, plan=plan, expanded=text):
            return False
        journal(prompt, "plan.created", {"plan": plan})
        tasks = {w["role"]: handoffs.support_worker_task(support_handoff(prompt, w)) for w in plan["workers"]}
        start_all(prompt, tasks, here)
    return True


def workers(prompt: Prompt, here: "Here") -> bool:
    plan = prompt.plan or {}
    planned = plan.get("workers", [])
    found = outcomes(prompt, [w["role"] for w in planned if not w.get("blocked")])
    done: list[tuple[dict[str, Any], Outcome]] = []
    for worker in planned:
        outcome = blocked_outcome(worker) or found.get(worker["role"])
        if outcome is None:
            return False
        if outcome.blocked:  # its SubagentStart hook refused it: the plan says so, with the reason
            worker["blocked"] = outcome.error
        done.append((worker, outcome))
    stops = {Event.SUBAGENT_STOP: sum(not o.failed for _, o in done), Event.STOP: int(prompt.is_team)}
    if not hold_for_hooks(prompt, Step.WORKERS, stops):
        return False  # another task is running its hooks

    def resolve(names: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
        return references.resolve_artifacts(saga=prompt.saga, names=names)

    results = [
        handoffs.executed(
            handoffs.failed_worker_result(support_handoff(prompt, w), o.error)
            if o.failed
            else handoffs.normalize_worker_result(o.output, support_handoff(prompt, w), resolve=resolve),
            role=w["role"],
            goal=w["goal"],
            error=o.error,
        )
        for w, o in done
    ]
    subagent_stop(prompt, [(w, o, r) for (w, o), r in zip(done, results, strict=True)])
    # Outside any transaction: connecting may start a server process or wait on a remote one.
    servers = {} if prompt.is_team else primary_mcp(prompt)
    final = stop_feedback(prompt, handoffs.team_answer(results)) if prompt.is_team else ""
    with actions.saga_transaction(prompt.saga):
        if prompt.is_team:
            answer = handoffs.team_answer(results)
            if not move(
                prompt, Step.WORKERS, Step.DONE, plan=plan, results=results, answer=answer, final_answer=final,
                status=Prompt.Status.COMPLETED,
            ):  # fmt: skip
                return False
            settle(prompt, [o for _, o in done])
            conclude(prompt, Prompt.Status.COMPLETED)
            return True
        if not move(prompt, Step.WORKERS, Step.PRIMARY, plan=plan, results=results, mcp=servers):
            return False
        settle(prompt, [o for _, o in done])
        role = plan["primary_role"]
        if servers:
            journal(prompt, "mcp_connect", {"role": role, "servers": servers})
        start(prompt, "primary", role=role, task=handoffs.primary_task(request_text(prompt), results, role), here=here)
    return True


def primary(prompt: Prompt, here: "Here") -> bool:
    outcome = outcomes(prompt, ["primary"]).get("primary")
    if outcome is None:
        return False
    if outcome.failed:
        return fail(prompt, Step.PRIMARY, f"The primary failed: {outcome.error}", settled=[outcome])
    answer = as_text(outcome.output)
    plan, brain = prompt.plan or {}, prompt.brain
    review = bool(plan.get("requires_review")) and brain.review_role in brain.roles
    review = review and plan.get("primary_role") != brain.review_role
    if not review and not hold_for_hooks(prompt, Step.PRIMARY, {Event.STOP: 1}):
        return False
    final = "" if review else stop_feedback(prompt, answer)
    with actions.saga_transaction(prompt.saga):
        if review:
            if not move(prompt, Step.PRIMARY, Step.REVIEW, answer=answer):
                return False
        elif not move(
            prompt, Step.PRIMARY, Step.DONE, answer=answer, final_answer=final, status=Prompt.Status.COMPLETED
        ):
            return False
        settle(prompt, [outcome])
        journal(prompt, "primary.completed", {"role": plan.get("primary_role"), "answer": answer[:4000]})
        if not review:
            conclude(prompt, Prompt.Status.COMPLETED)
            return True
        packet = review_handoff(prompt)
        start(
            prompt, "review", role=brain.review_role,
            task=handoffs.review_task(request_text(prompt), answer, prompt.results, packet), here=here,
        )  # fmt: skip
    return True


def review(prompt: Prompt, here: "Here") -> bool:
    outcome = outcomes(prompt, ["review"]).get("review")
    if outcome is None:
        return False
    if not hold_for_hooks(prompt, Step.REVIEW, {Event.STOP: 1}):
        return False
    verdict = handoffs.gate_review(
        None if outcome.failed else outcome.output, prompt.results, policy=prompt.brain.review_policy
    )
    final = stop_feedback(prompt, handoffs.merge_review(prompt.answer, verdict))
    blocked = verdict["decision"] == "blocked"
    status = Prompt.Status.BLOCKED if blocked else Prompt.Status.COMPLETED
    reason = ("; ".join(verdict["blocking_issues"]) or "The review blocked the answer.") if blocked else ""
    with actions.saga_transaction(prompt.saga):
        if not move(prompt, Step.REVIEW, Step.DONE, review=verdict, final_answer=final, status=status, reason=reason):
            return False
        settle(prompt, [outcome])
        journal(prompt, "review.completed", {"review": verdict})
        conclude(prompt, status, reason=reason)
    return True


def primary_mcp(prompt: Prompt) -> dict[str, dict[str, Any]]:
    """The reference's step 5: the MCP servers of the primary role's profile, connected before the
    primary runs, each with the tools offered or why it is not. The primary's own turns then
    connect to them through the executor (the check's connections are closed at once: those turns
    may run on another worker); a server that did not answer here is tried again by them."""
    role = (prompt.plan or {}).get("primary_role", "")
    name = prompt.brain.roles.get(role, "")
    profile = prompt.profiles_read.get(name) if prompt.profiles_read is not None else profile_named(name)
    return mcp.check_servers(f"prompt-{prompt.pk}", list(profile.mcp_servers) if profile else [])


def review_wanted(brain: Any, text: str) -> bool:
    """Whether the brain would have the prompt reviewed, were its review role able to see images."""
    routing = plans.Routing.of(brain)
    return bool(routing.review_role) and plans.heuristic_plan(text, routing)["requires_review"]


# --- what the hooks around the steps decided (each ran before its step's transaction: hooking) -----


def end_blocked(prompt: Prompt, entry: PreparedPrompt) -> bool:
    """A SessionStart or UserPromptSubmit handler blocked the prompt: it ends, nothing routed."""
    reason = entry.reason or f"Blocked by the {entry.event} hook {entry.blocked_by}."
    with actions.saga_transaction(prompt.saga):
        if not move(prompt, Step.ROUTING, Step.DONE, status=Prompt.Status.BLOCKED, reason=reason,
                    expanded=entry.text):  # fmt: skip
            return False
        conclude(prompt, Prompt.Status.BLOCKED, reason=reason)
    return True


def blocked_outcome(worker: dict[str, Any]) -> "Outcome | None":
    """A worker its SubagentStart hook blocked at routing, before that hook ran in the worker's own
    task (a prompt routed before then): failed, with the reason, and no run behind it."""
    return Outcome(None, error=worker["blocked"], failed=True) if worker.get("blocked") else None


def request_text(prompt: Prompt) -> str:
    """What workers get as the request: the expanded prompt (a prompt routed before hooks existed
    has none)."""
    return prompt.expanded or prompt.text


STEPS: dict[str, Callable[[Prompt, "Here"], bool]] = {
    Step.ROUTING: route,
    Step.WORKERS: workers,
    Step.PRIMARY: primary,
    Step.REVIEW: review,
}


# --- the pieces ----------------------------------------------------------------------------------


def settle(prompt: Prompt, outcomes: list[Outcome]) -> None:
    """Finish the runs that went idle with their answer, so that no delegate lingers."""
    for outcome in outcomes:
        run = outcome.run
        if (
            run is not None
            and run.status == Run.Status.IDLE
            and actions.finish_run(run=run, status=Run.Status.COMPLETED, result=outcome.output, actor=handle(prompt))
        ):
            # The executor journals worker_end only for a run that called finish; this one answered in text.
            record(
                saga_id=prompt.saga_id, type="worker_end", actor=run.collaborator.handle, run_id=run.pk,
                data={"status": Run.Status.COMPLETED, "result": outcome.output, "error": ""},
            )  # fmt: skip


def as_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        for key in ("answer", "summary", "text"):
            if isinstance(output.get(key), str):
                return output[key]
    return "" if output is None else json.dumps(output, ensure_ascii=False)


def support_handoff(prompt: Prompt, worker: dict[str, Any]) -> handoffs.Handoff:
    return handoffs.handoff(
        prompt_id=str(prompt.pk), slot=worker["role"], goal=worker["goal"], original_prompt=request_text(prompt),
        expected=SUPPORT_EXPECTED,
    )  # fmt: skip


def review_handoff(prompt: Prompt) -> handoffs.Handoff:
    return handoffs.handoff(
        prompt_id=str(prompt.pk), slot="review", goal="Review the primary answer against the request.",
        original_prompt=request_text(prompt), expected=REVIEW_EXPECTED,
    )  # fmt: skip


def start_all(prompt: Prompt, tasks: dict[str, str], here: "Here") -> None:
    """Delegate the support workers from the lead, all in one kernel action. The first one runs in
    the task that advanced this step (its process is free from now on: `here`); the others' first
    turns are rung after commit."""
    assert prompt.lead is not None
    if not tasks:
        return
    added = actions.add_agents(
        saga=prompt.saga, parent=prompt.lead.handle, by=prompt.lead.user,
        agents=[
            actions.NewAgent(name=prompt.worker_name(role), role=role, task=task, profile=profile_of(prompt, role),
                             runtime=Collaborator.Runtime.INTERNAL, ring=index > 0)
            for index, (role, task) in enumerate(tasks.items())
        ],
    )  # fmt: skip
    here.claim(added[0][0].run.pk)


def start(prompt: Prompt, slot: str, *, role: str, task: str, here: "Here") -> None:
    """Delegate one worker from the lead (the primary, the reviewer), claimed in the step's
    transaction for this task to run once that commits (`here`)."""
    assert prompt.lead is not None
    collaborator, _ = actions.add_agent(
        saga=prompt.saga, name=prompt.worker_name(slot), role=role, task=task, runtime=Collaborator.Runtime.INTERNAL,
        profile=profile_of(prompt, role), parent=prompt.lead.handle, by=prompt.lead.user, ring=False,
    )  # fmt: skip
    here.claim(collaborator.run.pk)


def profile_of(prompt: Prompt, role: str) -> str:
    """The role's profile in the prompt's brain; a brain reloaded without it since refuses the step."""
    if role not in prompt.brain.roles:
        raise errors.InvalidState(f"The brain {prompt.brain.name} has no role {role} any more: it was changed since.")
    return str(prompt.brain.roles[role])


class Here(list["Turns"]):
    """The runs a step hands to the task that advanced it (one per step: the first support worker,
    the primary, the reviewer), rather than through one more Celery hand-off: each claimed for that
    task's `worker` (its node name) and started in the step's transaction, so that one commit
    covers both. The task runs them once it has committed; a crash meanwhile leaves a claimed run
    whose lease lapses, and the reconciler queues it again."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def claim(self, run_id: str) -> None:
        from agents.executor import claim_turns  # which imports this module (through the tasks)

        turns = claim_turns(run_id, worker=self.worker)
        assert turns is not None, "a run created queued in this transaction, under the saga's lock"
        self.append(turns)


def move(prompt: Prompt, frm: str, to: str, **fields: Any) -> bool:
    """The compare-and-set every step ends with; False: another doorbell already moved it. On
    PostgreSQL the step goes on without waiting for the answer: the server fails the step's
    transaction instead (agora_step_moved(), agents/migrations/0007), and take_step() reads that
    error as this False (moved_first()). The step's lease (hooking.claim_step) ends with it."""
    moved = update(
        Prompt, {"id": prompt.pk, "step": frm}, or_fail="agora_step_moved", step=to, step_until=None,
        updated_at=timezone.now(), **fields,
    )  # fmt: skip
    for key, value in fields.items():
        setattr(prompt, key, value)
    prompt.step = to if moved else prompt.step
    return bool(moved)


def moved_first(exc: BaseException) -> bool:
    """Whether a database error is the server's word that another task moved the prompt first."""
    return failed_with(exc, STEP_MOVED)


STEP_MOVED = "AG002"  # the SQLSTATE of agora_step_moved()'s error


def fail(prompt: Prompt, frm: str, reason: str, *, settled: list[Outcome] | None = None) -> bool:
    """The prompt fails with the reason, and whatever it started that is still at work ends with
    it (a worker left idle by a step that raised would otherwise wait for a step that never comes)."""
    with actions.saga_transaction(prompt.saga):
        if not move(prompt, frm, Step.DONE, status=Prompt.Status.FAILED, reason=reason):
            return False
        settle(prompt, settled or [])
        for run in at_work_under(prompt):
            actions.end_run(run=run, status=Run.Status.FAILED, reason=reason, actor=f"agent:{prompt.lead_name}")
        conclude(prompt, Prompt.Status.FAILED, reason=reason)
    return True


def conclude(prompt: Prompt, status: str, *, reason: str = "") -> None:
    """The last event of an orchestration, and the end of its lead's run."""
    journal(prompt, f"prompt.{status}", {"status": status, "reason": reason, "answer": prompt.final_answer[:4000]})
    lead = prompt.lead
    if lead is not None:
        run = lead.run  # read with the prompt (its ending is a compare-and-set: a stale copy ends nothing twice)
        run_status = Run.Status.FAILED if status == Prompt.Status.FAILED else Run.Status.COMPLETED
        actions.finish_run(run=run, status=run_status, result={"prompt_id": str(prompt.pk), "status": status},
                           error=reason if run_status == Run.Status.FAILED else "")  # fmt: skip


def handle(prompt: Prompt) -> str:
    return f"agent:{prompt.lead_name}"


def journal(prompt: Prompt, type: str, data: dict[str, Any]) -> None:
    record(saga_id=prompt.saga_id, type=type, actor=handle(prompt), data={"prompt_id": str(prompt.pk), **data})
