"""Artifacts on the web: the dashboard's upload and download, and the download response the REST
API serves too. Whoever may see a saga may list, add and download its artifacts; to anyone else
the saga and its artifacts do not exist (404)."""

from typing import Any
from urllib.parse import quote
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from accounts.models import User
from sagas import actions, errors
from sagas.models import Artifact, Saga
from sagas.views import render_saga, saga_url


def download_response(artifact: Artifact) -> HttpResponse:
    """The artifact's bytes as a download, never rendered inline: an uploaded HTML or SVG file must
    not run in the dashboard's origin."""
    response = HttpResponse(bytes(artifact.content), content_type=artifact.content_type)
    response["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(artifact.name)}"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Length"] = str(artifact.size)
    return response


def upload_too_large(request: HttpRequest) -> bool:
    """Whether the declared body is over the limit, before anything is read."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    return (
        declared.isdigit() and int(declared) > settings.AGORA_MAX_ARTIFACT_BYTES + settings.AGORA_UPLOAD_FRAMING_BYTES
    )


class RefuseOversizedUploads(FileUploadHandler):
    """The first of FILE_UPLOAD_HANDLERS: a multipart body declared over the limit is not read past
    the start of its first file. A middleware reads the form before any view (the page's input
    check, CSRF's for a session), so the view's size check alone came after the whole file had gone
    to a temporary file. The fields before the file (the CSRF token) are read; the view refuses the
    upload by its declared size."""

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        if self.request is not None and upload_too_large(self.request):
            raise StopUpload(connection_reset=True)  # the rest of the body is left unread

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


def visible_saga(request: HttpRequest, saga_id: UUID) -> Saga:
    saga = Saga.objects.visible_to(request.user).filter(pk=saga_id).first()
    if saga is None:
        raise Http404("No such saga.")
    return saga


@login_required
@require_GET
def download_artifact(request: HttpRequest, saga_id: UUID, name: str) -> HttpResponse:
    saga = visible_saga(request, saga_id)
    artifact = Artifact.objects.filter(saga=saga, name=name).first()
    if artifact is None:
        raise Http404("No such artifact.")
    return download_response(artifact)


@login_required
@require_POST
def upload_artifact(request: HttpRequest, saga_id: UUID) -> HttpResponse:
    """Add a file, or a text typed into the form, under a name (the file's own name by default)."""
    saga = visible_saga(request, saga_id)
    values = {k: request.POST.get(k, "").strip() for k in ("name", "text")}
    upload = request.FILES.get("file")
    if upload_too_large(request):
        problems = {"file": [f"An artifact holds at most {settings.AGORA_MAX_ARTIFACT_BYTES} bytes."]}
    elif upload is None and not values["text"]:
        problems = {"file": ["Choose a file or write a text."]}
    else:
        name = values["name"] or (upload.name if upload is not None and upload.name else "")
        content = upload.read() if upload is not None else request.POST.get("text", "").encode()
        content_type = (upload.content_type if upload is not None else "") or "text/plain"
        assert isinstance(request.user, User)
        try:
            artifact = actions.add_artifact(
                saga=saga, name=name, content=content, content_type=content_type, by=request.user
            )
        except errors.KernelError as exc:
            fields = exc.extra.get("errors")
            about_name = isinstance(exc, errors.NameTaken) or (isinstance(fields, dict) and "name" in fields)
            problems = {"name" if about_name else "file": [exc.detail]}
        else:
            messages.success(request, f"Artifact {artifact.name} added ({artifact.size} bytes).")
            return redirect(saga_url(saga, "artifacts"))
    return render_saga(request, saga, forms={"artifact": {"values": values, "errors": problems}}, status=400)
