"""Every API error as `application/problem+json` with a stable `code`."""

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response


class Problem(Exception):
    """An error the API reports as problem+json with its stable code and HTTP status. Each layer
    derives its own (the kernel's are `sagas.errors`), so that this handler imports none of them."""

    code = "error"
    status = 400
    title = "Error"

    def __init__(self, detail: str = "", **extra: object) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.extra = extra


_DRF_CODES: list[tuple[type[Exception], str, str]] = [
    (exceptions.NotAuthenticated, "not_authenticated", "Not authenticated"),
    (exceptions.AuthenticationFailed, "authentication_failed", "Authentication failed"),
    (exceptions.PermissionDenied, "forbidden", "Forbidden"),
    (exceptions.NotFound, "not_found", "Not found"),
    (exceptions.ParseError, "invalid_payload", "Malformed request body"),
    (exceptions.ValidationError, "invalid_payload", "Invalid payload"),
    (exceptions.MethodNotAllowed, "method_not_allowed", "Method not allowed"),
    (exceptions.NotAcceptable, "not_acceptable", "Not acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type", "Unsupported media type"),
    (exceptions.Throttled, "throttled", "Too many requests"),
]


def problem_body(status_code: int, code: str, title: str, detail: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "about:blank", "title": title, "status": status_code, "code": code, "detail": detail, **extra}


API_PREFIX = "/api/"
# Where machines call, and read a refusal as problem+json: the REST API and the A2A and MCP gateways.
MACHINE_PATHS = (API_PREFIX, "/a2a/", "/mcp")


def refusal_body(path: str, status_code: int, code: str, title: str, detail: str) -> tuple[str, bytes]:
    """A refusal before any view, as its content type and body: problem+json where machines call,
    plain text elsewhere (a page's form, a browser)."""
    if path.startswith(MACHINE_PATHS):
        return "application/problem+json", json.dumps(problem_body(status_code, code, title, detail)).encode()
    return "text/plain; charset=utf-8", f"{code}: {detail}".encode()


def problem(status_code: int, code: str, title: str, detail: Any, **extra: Any) -> Response:
    body = problem_body(status_code, code, title, detail, **extra)
    return Response(body, status=status_code, content_type="application/problem+json")


def problem_response(status_code: int, code: str, title: str, detail: str) -> JsonResponse:
    """problem() where DRF does not answer: middleware, Django's error handlers."""
    body = problem_body(status_code, code, title, detail)
    return JsonResponse(body, status=status_code, content_type="application/problem+json")


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, Problem):
        return problem(exc.status, exc.code, exc.title, exc.detail, **exc.extra)
    if isinstance(exc, READ_REFUSALS):  # Django refused the request as it read it
        return problem(*read_refusal(exc))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None
    code, title = next(
        ((code, title) for cls, code, title in _DRF_CODES if isinstance(exc, cls)), (str(exc.default_code), "Error")
    )
    if isinstance(exc, exceptions.ValidationError):
        return problem(exc.status_code, code, title, "The request has invalid fields.", errors=exc.detail)
    response = problem(exc.status_code, code, title, exc.detail)
    if auth_header := getattr(exc, "auth_header", None):
        response["WWW-Authenticate"] = auth_header
    if wait := getattr(exc, "wait", None):
        response["Retry-After"] = str(int(wait))
    return response


# What Django refuses as it reads a request: a body past its limit, more fields or files than it reads.
READ_REFUSALS = (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)


def read_refusal(exc: Exception) -> tuple[int, str, str, str]:
    """What a refusal of READ_REFUSALS answers: status, code, title, detail (in words of ours:
    Django's name its settings)."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return 413, "payload_too_large", "Payload too large", f"Limit is {limit} bytes for a request body."
    files = isinstance(exc, TooManyFilesSent)
    limit, what = (
        (settings.DATA_UPLOAD_MAX_NUMBER_FILES, "files")
        if files
        else (settings.DATA_UPLOAD_MAX_NUMBER_FIELDS, "fields")
    )
    return 400, "invalid_payload", "Invalid payload", f"More than {limit} {what} in one request."


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's handler400, for a refusal raised before any view (a middleware read the body or the
    query string): for READ_REFUSALS, a problem for API clients and a page that says why for
    browsers; any other refusal (a Host not allowed) Django's own answer, which says nothing."""
    if not isinstance(exception, READ_REFUSALS):
        return defaults.bad_request(request, exception)
    status, code, title, detail = read_refusal(exception)
    if request.path_info.startswith(API_PREFIX):
        return problem_response(status, code, title, detail)
    return render(request, "400.html", {"title": title, "detail": detail}, status=status)


# What a crash says, wherever it is answered: nothing of why.
SERVER_ERROR_DETAIL = "Something went wrong on our side; it has been logged."


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's handler500: a problem for API clients, the plain page for browsers; no details."""
    if request.path_info.startswith(API_PREFIX):
        return problem_response(500, "server_error", "Server error", SERVER_ERROR_DETAIL)
    return defaults.server_error(request)
