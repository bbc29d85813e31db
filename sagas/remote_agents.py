"""Remote A2A agents on the saga page: a manager allows one (name, URL, the variable holding its
token) or removes it, with plain forms. Everyone who sees the saga sees the list."""

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from accounts.models import User
from sagas import actions, errors
from sagas.views import form_errors, managed_saga, render_saga, saga_url


@login_required
@require_POST
def allow_remote_agent(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    saga = managed_saga(request, saga_id, "Only managers of the saga allow remote agents.")
    values = {k: request.POST.get(k, "").strip() for k in ("name", "url", "token_env")}
    assert isinstance(request.user, User)
    try:
        remote = actions.allow_remote_agent(
            saga=saga, name=values["name"], url=values["url"], token_env=values["token_env"], by=request.user
        )
    except errors.NameTaken as exc:
        problems = form_errors(exc, default="name")
    except errors.InvalidPayload as exc:
        problems = form_errors(exc)
    else:
        messages.success(request, f"Agents of this saga may now call {remote.name} ({remote.url}).")
        return redirect(saga_url(saga, "remote-agents"))
    return render_saga(request, saga, forms={"remote": {"values": values, "errors": problems}}, status=400)


@login_required
@require_POST
def remove_remote_agent(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    saga = managed_saga(request, saga_id, "Only managers of the saga remove remote agents.")
    name = request.POST.get("name", "")
    assert isinstance(request.user, User)
    try:
        actions.remove_remote_agent(saga=saga, name=name, by=request.user)
    except errors.NotFound as exc:
        raise Http404(exc.detail) from exc
    messages.success(request, f"{name} removed: agents can no longer call it.")
    return redirect(saga_url(saga, "remote-agents"))
