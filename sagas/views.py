"""The dashboard: server-rendered pages, and the small fragments its script re-fetches live.

Each view parses its input, fetches through a query scoped to the signed-in person (an outsider
gets 404 for everything under a saga), calls an action, and renders. Live parts are the same
templates the page includes, so the page reads the same with or without JavaScript.
"""

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.module_loading import import_string
from django.views.decorators.http import require_POST, require_safe

from accounts.models import User
from config.params import FORM_SENT, InvalidParameter, form_key, integer_param
from sagas import actions, dashboard, errors
from sagas.access import JournalLens, collaborator_for, may_manage
from sagas.models import Artifact, Collaborator, Saga

FormErrors = dict[str, list[str]]
RUNTIMES = [
    (Collaborator.Runtime.INTERNAL, "Internal (Agora runs it)"),
    (Collaborator.Runtime.EXTERNAL, "External (REST API)"),
]


def visible_saga(request: HttpRequest, saga_id: UUID) -> Saga:
    """The saga if the signed-in person may see it; 404 otherwise, whether absent or forbidden."""
    return get_object_or_404(Saga.objects.visible_to(request.user).select_related("owner"), pk=saga_id)


def managed_saga(request: HttpRequest, saga_id: UUID, refusal: str) -> Saga:
    """The saga, for a manager's form: 404 when the user may not see it, 403 when they may not manage it."""
    saga = visible_saga(request, saga_id)
    if not may_manage(request.user, saga):
        raise PermissionDenied(refusal)
    return saga


def bad_parameter(exc: InvalidParameter) -> HttpResponse:
    """A query parameter that is not a number: 400, as the API says it (`invalid_payload`)."""
    return HttpResponse(f"invalid_payload: {exc.detail}", status=400, content_type="text/plain")


def form_errors(exc: errors.KernelError, *, default: str = "form") -> FormErrors:
    """A kernel error as errors per form field (InvalidPayload names its fields)."""
    per_field = exc.extra.get("errors")
    if isinstance(per_field, dict) and per_field:
        return {str(k): [str(m) for m in v] if isinstance(v, list) else [str(v)] for k, v in per_field.items()}
    return {default: [exc.detail]}


def saga_url(saga: Saga, anchor: str = "") -> str:
    return reverse("sagas:detail", args=[saga.pk]) + (f"#{anchor}" if anchor else "")


# --- the list ----------------------------------------------------------------------------------


@login_required
@require_safe
def saga_list(request: HttpRequest) -> HttpResponse:
    return render_list(request)


def render_list(
    request: HttpRequest, *, values: dict[str, str] | None = None, errors_: FormErrors | None = None, status: int = 200
) -> HttpResponse:
    context = {
        "sagas": dashboard.sagas_for(request.user),
        "waiting": dashboard.pending_forms_for(request.user),
        "policies": Saga.Policy.choices,
        "values": values or {"policy": Saga.Policy.TREE},
        "errors": errors_ or {},
    }
    return render(request, "sagas/saga_list.html", context, status=status)


@login_required
@require_POST
def saga_create(request: HttpRequest) -> HttpResponse:
    """The form on the list page; sent twice (its one-time key), it creates one saga, whose page
    both answers open."""
    values = {k: request.POST.get(k, "").strip() for k in ("title", "goal", "policy")}
    assert isinstance(request.user, User)
    try:
        saga, created = actions.create_saga_once(
            title=values["title"], goal=values["goal"], policy=values["policy"], owner=request.user,
            idempotency_key=form_key(request.POST),
        )  # fmt: skip
    except errors.IdempotencyConflict:
        return render_list(request, values=values, errors_={"form": [FORM_SENT]}, status=400)
    except errors.InvalidPayload as exc:
        return render_list(request, values=values, errors_=form_errors(exc), status=400)
    if created:
        messages.success(request, f"Saga “{saga.title}” created. Add agents and people to get it going.")
    return redirect(saga_url(saga))


# --- the saga page -----------------------------------------------------------------------------


@login_required
@require_safe
def saga_detail(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    saga = visible_saga(request, saga_id)
    try:
        before = integer_param(request.GET, "before", default=-1)
    except InvalidParameter as exc:
        return bad_parameter(exc)
    return render_saga(request, saga, before=None if before < 0 else before)


def render_saga(
    request: HttpRequest,
    saga: Saga,
    *,
    before: int | None = None,
    bound: dashboard.Submitted | None = None,
    forms: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    """The whole page; `bound` and `forms` carry a rejected submission back to its form."""
    lens = JournalLens(request.user, saga)
    events, has_older = dashboard.events_page(saga, lens, before=before)
    can_manage = may_manage(request.user, saga)
    context: dict[str, Any] = {
        "saga": saga,
        "me": collaborator_for(request.user, saga),
        "can_manage": can_manage,
        "events": events,
        "has_older": has_older,
        "oldest_seq": min((e.seq for e in events), default=0),
        "last_seq": dashboard.latest_seq(events),
        "live": before is None,
        "event_count": saga.journal_events.count(),
        "runtimes": RUNTIMES,
        "forms": forms or {},
        "artifacts": Artifact.objects.listing(saga),
        "remote_agents": actions.remote_agents_of(saga),
    }
    for part in PARTS.values():
        context.update(part(request, saga))
    panels: list[dict[str, str]] = []
    for name, (title, part_path, template, prefixes) in settings.AGORA_SAGA_PANELS.items():
        context.update(import_string(part_path)(request, saga))
        panels.append({"name": name, "title": title, "template": template, "events": ",".join(prefixes)})
    context["panels"] = panels
    context["inbox"], context["answered"] = dashboard.inbox_for(saga, request.user, bound=bound)
    return render(request, "sagas/saga_detail.html", context, status=status)


def team_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    team = dashboard.team(saga, request.user)
    return {
        "team": team, "roster": team.roster(), "saga": saga, "can_manage": may_manage(request.user, saga),
        "public_url": settings.AGORA_PUBLIC_URL or request.build_absolute_uri("/"),
    }  # fmt: skip


def requests_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    open_requests, done_requests = dashboard.request_board(saga, request.user)
    return {
        "open_requests": open_requests,
        "done_requests": done_requests,
        "can_manage": may_manage(request.user, saga),
    }


def inbox_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    inbox, answered = dashboard.inbox_for(saga, request.user)
    return {"saga": saga, "inbox": inbox, "answered": answered}


def workers_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    return {"workers": dashboard.workers(saga, JournalLens(request.user, saga))}


def teams_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    return {"teams": dashboard.teams(saga, request.user)}


def stats_part(request: HttpRequest, saga: Saga) -> dict[str, Any]:
    return {**team_part(request, saga), **requests_part(request, saga), "event_count": saga.journal_events.count()}


# Each live part: the context it needs, and its template (also included by the page).
PARTS: dict[str, Callable[[HttpRequest, Saga], dict[str, Any]]] = {
    "team": team_part,
    "requests": requests_part,
    "workers": workers_part,
    "teams": teams_part,
}
PART_TEMPLATES = {
    "team": "sagas/parts/team.html",
    "roster": "sagas/parts/roster.html",
    "stats": "sagas/parts/stats.html",
    "requests": "sagas/parts/requests.html",
    "workers": "sagas/parts/workers.html",
    "inbox": "sagas/parts/inbox.html",
    "teams": "sagas/parts/teams.html",
}
PART_CONTEXT: dict[str, Callable[[HttpRequest, Saga], dict[str, Any]]] = {
    "team": team_part,
    "roster": team_part,
    "stats": stats_part,
    "requests": requests_part,
    "workers": workers_part,
    "inbox": inbox_part,
    "teams": teams_part,
}


@login_required
@require_safe
def saga_part(request: HttpRequest, saga_id: UUID, part: str) -> HttpResponse:
    """One live part of the page, re-fetched by the page's script when a journal event arrives."""
    saga = visible_saga(request, saga_id)
    if part in settings.AGORA_SAGA_PANELS:  # a part the runtime renders (settings.AGORA_SAGA_PANELS)
        _, part_path, template, _ = settings.AGORA_SAGA_PANELS[part]
        return render(request, template, {"saga": saga, **import_string(part_path)(request, saga)})
    if part not in PART_TEMPLATES:
        raise Http404(f"No part {part}.")
    context = {"saga": saga, **PART_CONTEXT[part](request, saga)}
    return render(request, PART_TEMPLATES[part], context)


@login_required
@require_safe
def journal_rows(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """Timeline rows: `?after=N` (newer, oldest first, for the live view) or `?before=N` (older,
    newest first, for "load older"). Headers say where the next page starts."""
    saga = visible_saga(request, saga_id)
    try:
        after, before = (integer_param(request.GET, name, default=-1) for name in ("after", "before"))
    except InvalidParameter as exc:
        return bad_parameter(exc)
    lens = JournalLens(request.user, saga)
    if after >= 0:
        events, more = dashboard.events_after(saga, lens, after)
    elif before >= 0:
        events, more = dashboard.events_page(saga, lens, before=before)
    else:
        return HttpResponse("Give after=N or before=N.", status=400, content_type="text/plain")
    response = render(request, "sagas/parts/journal_rows.html", {"saga": saga, "events": events})
    response["X-More"] = "1" if more else "0"
    return response


# --- writes ------------------------------------------------------------------------------------


@login_required
@require_POST
def answer_form(request: HttpRequest, saga_id: UUID, human_request_id: str) -> HttpResponse:
    """Answer a form addressed to the signed-in person; the kernel validates it against its schema."""
    saga = visible_saga(request, saga_id)
    human_request = dashboard.addressed_form(saga, request.user, human_request_id)
    if human_request is None:
        raise Http404("No such form for you.")
    answer = dashboard.answer_from_post(human_request, request.POST)
    assert isinstance(request.user, User)
    try:
        actions.answer_human_request(human_request_id=human_request.pk, answer=answer, by=request.user)
    except errors.InvalidPayload as exc:
        bound = {human_request.pk: (answer, form_errors(exc))}
        return render_saga(request, saga, bound=bound, status=400)
    except errors.AlreadyAnswered:
        messages.info(request, f"“{human_request.title}” was already answered.")
        return redirect(saga_url(saga, "inbox"))
    except errors.RequestClosed as exc:
        messages.info(request, exc.detail)
        return redirect(saga_url(saga, "inbox"))
    messages.success(request, f"Answer sent to {human_request.asker.handle}.")
    return redirect(saga_url(saga, "inbox"))


@login_required
@require_POST
def steer_agent(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """A manager's message to an agent, delivered at its next turn boundary."""
    saga = visible_saga(request, saga_id)
    values = {k: request.POST.get(k, "").strip() for k in ("to", "message")}
    target = actions.find_collaborator(saga, values["to"])
    problems: FormErrors = {}
    if target is None or not target.is_agent:
        problems["to"] = ["Choose an agent of this saga."]
    if not values["message"]:
        problems["message"] = ["Write a message."]
    if not problems and target is not None:
        assert isinstance(request.user, User)
        try:
            actions.steer(
                saga=saga, to=target, message=values["message"], by=request.user, idempotency_key=form_key(request.POST)
            )  # the form sent twice: one message
        except errors.Forbidden as exc:
            raise PermissionDenied(exc.detail) from exc
        except errors.IdempotencyConflict:
            problems = {"message": [FORM_SENT]}
        except errors.KernelError as exc:
            problems = form_errors(exc, default="message")
        else:
            messages.success(request, f"Message queued for {target.handle}; it reads it at its next turn.")
            return redirect(saga_url(saga, "steer"))
    return render_saga(request, saga, forms={"steer": {"values": values, "errors": problems}}, status=400)


@login_required
@require_POST
def add_agent(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """Add an agent: internal (Agora runs it, by profile) or external (it gets a token, shown once).
    The form sent twice (its one-time key) adds one agent; the token was in the first answer, which
    the browser replaced with the second's: that one says so, and how to get another."""
    saga = managed_saga(request, saga_id, "Only managers of the saga add collaborators.")
    fields = ("name", "role", "task", "runtime", "profile", "parent")
    values = {k: request.POST.get(k, "").strip() for k in fields}
    assert isinstance(request.user, User)
    try:
        agent = actions.NewAgent(
            name=values["name"], role=values["role"], task=values["task"], runtime=values["runtime"],
            profile=values["profile"],
        )  # fmt: skip
        collaborator, token, created = actions.add_agent_once(
            saga=saga, agent=agent, parent=values["parent"] or None, by=request.user,
            idempotency_key=form_key(request.POST),
        )  # fmt: skip
    except errors.Forbidden as exc:
        raise PermissionDenied(exc.detail) from exc
    except errors.IdempotencyConflict:
        return render_saga(request, saga, forms={"agent": {"values": values, "errors": {"form": [FORM_SENT]}}},
                           status=400)  # fmt: skip
    except errors.NameTaken as exc:
        return render_saga(
            request, saga, forms={"agent": {"values": values, "errors": {"name": [exc.detail]}}}, status=400
        )
    except errors.NotFound as exc:
        return render_saga(
            request, saga, forms={"agent": {"values": values, "errors": {"parent": [exc.detail]}}}, status=400
        )
    except errors.KernelError as exc:  # a bad field, a cap reached, a finished saga
        return render_saga(request, saga, forms={"agent": {"values": values, "errors": form_errors(exc)}}, status=400)
    if not created and collaborator.runtime == Collaborator.Runtime.EXTERNAL:
        messages.warning(
            request, f"{collaborator.handle} was added by this form's first submission, whose answer showed its "
            "token. If you did not see it, issue a new one with New token on its row.",
        )  # fmt: skip
        return redirect(saga_url(saga, "team"))
    if token is None:
        if created:
            messages.success(request, f"{collaborator.handle} joined; its first turn is queued.")
        return redirect(saga_url(saga, "team"))
    # The token is shown in this response only: it never goes through a cookie, the session or a cache.
    response = render_saga(request, saga, forms={"token": {"handle": collaborator.handle, "token": token}}, status=201)
    add_never_cache_headers(response)
    return response


@login_required
@require_POST
def agent_token(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """A manager rotates an external agent's token (the new one shown once) or revokes it."""
    saga = managed_saga(request, saga_id, "Only managers of the saga change agents' tokens.")
    handle, action = request.POST.get("agent", ""), request.POST.get("action", "")
    assert isinstance(request.user, User)
    try:
        if action == "rotate":
            agent, key = actions.rotate_agent_token(saga=saga, handle=handle, by=request.user)
            response = render_saga(
                request, saga, forms={"token": {"handle": agent.handle, "token": key, "rotated": True}}
            )
            response["Cache-Control"] = "no-store"
            return response
        if action == "revoke":
            agent = actions.revoke_agent_token(saga=saga, handle=handle, by=request.user)
            messages.success(request, f"{agent.handle}'s token is revoked: its calls and connections are refused.")
            return redirect(saga_url(saga, "team"))
    except errors.NotFound as exc:
        raise Http404(exc.detail) from exc
    except (errors.InvalidState, errors.SagaFinished) as exc:  # an internal agent (it has no token), a finished saga
        return HttpResponse(f"{exc.code}: {exc.detail}", status=409, content_type="text/plain")
    return HttpResponse("invalid_payload: action is rotate or revoke.", status=400, content_type="text/plain")


@login_required
@require_POST
def agent_exposure(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """A manager exposes an agent to A2A clients (it gets an agent card) or withdraws it."""
    saga = managed_saga(request, saga_id, "Only managers of the saga expose its agents.")
    handle, exposed = request.POST.get("agent", ""), request.POST.get("exposed", "")
    if exposed not in ("1", "0"):
        return HttpResponse("invalid_payload: exposed is 1 or 0.", status=400, content_type="text/plain")
    assert isinstance(request.user, User)
    try:
        agent = actions.set_exposed(saga=saga, handle=handle, exposed=exposed == "1", by=request.user)
    except errors.NotFound as exc:
        raise Http404(exc.detail) from exc
    except errors.SagaFinished as exc:  # a page left open: it exposes nothing any more
        return HttpResponse(f"{exc.code}: {exc.detail}", status=409, content_type="text/plain")
    if agent.exposed:
        card = dashboard.a2a_card_url(settings.AGORA_PUBLIC_URL or request.build_absolute_uri("/"), agent)
        messages.success(request, f"{agent.handle} is exposed to A2A clients; its card: {card}")
    else:
        messages.success(request, f"{agent.handle} is no longer exposed: its card and endpoint answer 404.")
    return redirect(saga_url(saga, "team"))


@login_required
@require_POST
def add_person(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """Add a person by username, with a role: they see the saga and answer forms addressed to them."""
    saga = managed_saga(request, saga_id, "Only managers of the saga add collaborators.")
    values = {k: request.POST.get(k, "").strip() for k in ("username", "role", "task")}
    person = User.objects.filter(username=values["username"], kind=User.Kind.HUMAN, is_active=True).first()
    problems: FormErrors = {}
    if person is None:
        problems = {"username": [f"No person signs in as “{values['username']}”."]}
    else:
        assert isinstance(request.user, User)
        try:
            collaborator, created = actions.add_human_once(
                saga=saga, user=person, role=values["role"], task=values["task"], by=request.user,
                idempotency_key=form_key(request.POST),
            )  # fmt: skip
        except errors.Forbidden as exc:
            raise PermissionDenied(exc.detail) from exc
        except errors.IdempotencyConflict:
            problems = {"form": [FORM_SENT]}
        except errors.NameTaken as exc:
            problems = {"username": [exc.detail]}
        except (errors.InvalidPayload, errors.SagaFinished) as exc:
            problems = form_errors(exc)
        else:
            if created:  # the form sent again: its first submission said so
                messages.success(request, f"{collaborator.handle} joined as {collaborator.role or 'a collaborator'}.")
            return redirect(saga_url(saga, "team"))
    return render_saga(request, saga, forms={"person": {"values": values, "errors": problems}}, status=400)


@login_required
@require_POST
def finish_saga(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """A manager finishes the saga (completed or cancelled): everything still at work in it ends."""
    saga = managed_saga(request, saga_id, "Only managers of the saga finish it.")
    values = {k: request.POST.get(k, "").strip() for k in ("status", "reason")}
    assert isinstance(request.user, User)
    try:
        actions.finish_saga(saga=saga, status=values["status"], reason=values["reason"], by=request.user)
    except errors.InvalidPayload as exc:
        return render_saga(request, saga, forms={"finish": {"values": values, "errors": form_errors(exc)}}, status=400)
    except errors.SagaFinished as exc:
        messages.info(request, exc.detail)
        return redirect(saga_url(saga))
    messages.success(request, f"The saga is {values['status']}: its agents and teams have stopped.")
    return redirect(saga_url(saga))
