"""The saga page's prompt box and plan views. The page belongs to the kernel, which imports none of
this: `AGORA_SAGA_PANELS` names `prompts_part`, and the page includes its template, live and
without JavaScript alike."""

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from accounts.models import User
from agents.hooks.lifecycle import FEEDBACK_HEADING
from agents.hooks.models import HookResult
from agents.orchestrator import actions, cancel, reads
from agents.orchestrator.models import Brain, Prompt
from config.params import FORM_SENT, form_key
from sagas import errors
from sagas.access import may_manage
from sagas.models import Collaborator, Run, Saga

PROMPTS_SHOWN = 10  # plan views on the saga page; older prompts are listed, each with a page of its own
OLDER_LISTED = 100


def prompts_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    """Each recent prompt's plan view: prompt → support workers (live) → primary → review → the
    final answer; then links to the older ones."""
    prompts = Prompt.objects.filter(saga=saga)
    recent = list(prompts.select_related("brain")[:PROMPTS_SHOWN])
    older = (
        list(prompts.only("id", "text", "status", "created_at")[PROMPTS_SHOWN : PROMPTS_SHOWN + OLDER_LISTED + 1])
        if len(recent) == PROMPTS_SHOWN
        else []
    )
    manages = may_manage(request.user, saga)
    return {
        "prompts": plan_views(saga, recent),
        "older": older[:OLDER_LISTED],
        "older_more": len(older) > OLDER_LISTED,
        "can_prompt": manages and not saga.is_finished,
        "can_cancel": manages,
        "brains": list(Brain.objects.values_list("name", flat=True)),
    }


def plan_views(saga: Saga, prompts: list[Prompt]) -> list[dict[str, Any]]:
    """The plan views of a saga's prompts, with their workers' runs and hook runs (two queries)."""
    # Each with whether it waits on an answer to something it asked: a worker idle on one is not done
    # (reads.outcomes), and live_status() says it waits.
    asking = RawSQL(reads.asks_open(f'"{Collaborator._meta.db_table}"."id"'), [], output_field=BooleanField())
    if not prompts:
        return []
    leads = Q()
    for prompt in prompts:  # their leads and workers: `brain-<id>` and `brain-<id>.<slot>`
        leads |= Q(name__startswith=prompt.lead_name)
    brains = Collaborator.objects.filter(leads, saga=saga).annotate(asking=asking)
    runs = {c.name: c.run for c in brains.select_related("run") if hasattr(c, "run")}
    hooks = hook_outcomes(saga, prompts)
    return [{**plan_view(p, runs, hooks.get(str(p.pk), [])), "hooks": hooks.get(str(p.pk), [])} for p in prompts]


@login_required
@require_safe
def prompt_page(request: HttpRequest, saga_id: UUID, prompt_id: UUID) -> HttpResponse:
    """One prompt's plan view on a page of its own, for anyone who may see the saga: an older prompt
    that the saga page no longer shows, or a link to one (it stays readable after the saga ends)."""
    saga = get_object_or_404(Saga.objects.visible_to(request.user), pk=saga_id)
    prompt = get_object_or_404(Prompt.objects.select_related("brain"), pk=prompt_id, saga=saga)
    (view,) = plan_views(saga, [prompt])
    context = {"saga": saga, "view": view, "can_cancel": may_manage(request.user, saga)}
    return render(request, "agents/prompt.html", context)


def hook_outcomes(saga: Saga, prompts: list[Prompt]) -> dict[str, list[dict[str, Any]]]:
    """Each prompt's hook runs, in the order they happened (one query): what blocked, what added
    context, what failed or timed out."""
    if not prompts:
        return {}
    keys = Q()
    for prompt in prompts:
        keys |= Q(key__startswith=f"prompt:{prompt.pk}:")
    found: dict[str, list[dict[str, Any]]] = {}
    for result in HookResult.objects.filter(keys, saga=saga).order_by("created_at", "pk"):
        _, prompt_id, _, role = [*result.key.split(":", 3), ""][:4]  # prompt:<id>:<event>[:<role>]
        found.setdefault(prompt_id, []).append(
            {"event": result.event, "role": role, "handler": result.handler, "status": result.status,
             "reason": result.reason, "error": result.error, "context_chars": len(result.context),
             "duration_ms": result.duration_ms}
        )  # fmt: skip
    return found


def live_status(run: Run | None) -> str:
    if run is None:
        return "waiting"
    if run.status == Run.Status.IDLE:
        return "waiting" if getattr(run.collaborator, "asking", False) else "answered"  # prompts_part's
    return str(run.status)


def plan_view(prompt: Prompt, runs: dict[str, Run], hooks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    plan = prompt.plan or {}
    results = {r["role"]: r for r in prompt.results}
    # A worker its SubagentStart hook blocked shows as such at once, before the plan records it.
    refused = {
        h["role"]: h["reason"] or f"Blocked by the SubagentStart hook {h['handler']}."
        for h in reversed(hooks or [])
        if h["event"] == "SubagentStart" and h["status"] == "blocked"
    }
    workers = []
    for w in plan.get("workers", []):
        result = results.get(w["role"])
        w = {**w, "blocked": w.get("blocked") or refused.get(w["role"], "")}
        workers.append(
            {
                **w,
                "status": "blocked"
                if w.get("blocked")
                else result["status"]
                if result
                else live_status(runs.get(prompt.worker_name(w["role"]))),
                "summary": result["summary"] if result else "",
                # A blocked worker's one risk is the block's reason, shown as such.
                "risks": [r for r in result["risks"] if r != w.get("blocked")] if result else [],
                "artifacts": result["artifacts"] if result else [],
            }
        )
    primary_run = runs.get(prompt.worker_name("primary"))
    review_run = runs.get(prompt.worker_name("review"))
    review = prompt.review or {}
    # What the user gets once the prompt is over: the answer with the review merged in and the Stop
    # hook's feedback after it (a prompt ended without one has at most the primary's answer). While
    # it runs there is none yet: the primary's answer shows under the primary.
    final = "" if prompt.status == Prompt.Status.RUNNING else prompt.final_answer or prompt.answer
    answer, _, feedback = final.partition(f"\n\n{FEEDBACK_HEADING}\n")
    return {
        "prompt": prompt,
        "plan": plan,
        "workers": workers,
        "primary": {
            "role": plan.get("primary_role", ""),
            "status": "completed" if prompt.answer else live_status(primary_run) if primary_run else "waiting",
        },
        "review_needed": bool(plan.get("requires_review")) and not prompt.is_team,
        "review": review,
        "review_status": review.get("decision") or (live_status(review_run) if review_run else "waiting"),
        "final_answer": answer,
        "feedback": feedback,
    }


@login_required
@require_POST
def submit_prompt(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """The prompt box: a manager submits, the page shows the new plan view. The box sent twice (its
    one-time key) starts one orchestration."""
    saga = get_object_or_404(Saga.objects.visible_to(request.user), pk=saga_id)
    assert isinstance(request.user, User)
    team = request.POST.get("team", "").replace(",", " ").split()
    try:
        actions.submit_prompt(
            saga=saga, by=request.user, text=request.POST.get("prompt", ""), team=team,
            brain=request.POST.get("brain", ""), images=request.POST.get("images", "").split(),
            idempotency_key=form_key(request.POST),
        )  # fmt: skip
    except errors.Forbidden:
        return HttpResponse("Only managers of the saga submit prompts.", status=403)
    except errors.IdempotencyConflict:
        messages.error(request, FORM_SENT)
    except errors.KernelError as exc:
        messages.error(request, f"Prompt not submitted: {exc.detail}")
    else:
        messages.success(request, "Prompt submitted: the Brain is planning it.")
    return redirect(reverse("sagas:detail", args=[saga.pk]) + "#prompts")


@login_required
@require_POST
def cancel_prompt(request: HttpRequest, saga_id: UUID, prompt_id: UUID) -> HttpResponse:
    """A plan view's Cancel button (managers, while the prompt runs): back to the page it was on."""
    saga = get_object_or_404(Saga.objects.visible_to(request.user), pk=saga_id)
    prompt = get_object_or_404(Prompt, pk=prompt_id, saga=saga)
    assert isinstance(request.user, User)
    try:
        cancel.cancel_prompt(prompt_id=prompt.pk, by=request.user)
    except errors.Forbidden:
        return HttpResponse("Only managers of the saga cancel prompts.", status=403)
    except errors.KernelError as exc:
        messages.error(request, f"Prompt not cancelled: {exc.detail}")
    else:
        messages.success(request, "Prompt cancelled, with the work it had started.")
    if request.POST.get("back") == "page":
        return redirect("prompt-page", saga.pk, prompt.pk)
    return redirect(reverse("sagas:detail", args=[saga.pk]) + "#prompts")
