"""Input checks that hold for every request, before any view sees it."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from config.payloads import text_problem
from config.problems import API_PREFIX, refusal_body


def refuse(request: HttpRequest, status: int, code: str, title: str, detail: str) -> HttpResponse:
    """A refusal before any view: problem+json under the API, plain text elsewhere."""
    content_type, body = refusal_body(request.path_info, status, code, title, detail)
    return HttpResponse(body, status=status, content_type=content_type)


class RequireContentLength:
    """Refuse a request whose body comes without a Content-Length (chunked) with a 411
    `length_required`: it would otherwise reach its view with an empty body, and an API client an
    error about missing fields where the fields were sent."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        if not (meta.get("HTTP_TRANSFER_ENCODING") and not meta.get("CONTENT_LENGTH")):
            return self.get_response(request)
        detail = "Send the body with a Content-Length header (a chunked body is not read)."
        return refuse(request, 411, "length_required", "Length required", detail)


class RefuseUnstorableInput:
    """Refuse a path, query string or submitted form holding text no database can store (NUL;
    lone surrogates cannot arrive here, since Django decodes with replacement) with a 400
    `invalid_payload`, before a view passes it to a lookup or a write.

    JSON bodies are checked by the API's parser (config/parsers.py); forms are read here only
    outside the API, whose views take JSON.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = self.problem(request)
        if problem is None:
            return self.get_response(request)
        return refuse(request, 400, "invalid_payload", "Invalid payload", problem)

    def problem(self, request: HttpRequest) -> str | None:
        if why := text_problem(request.path_info):
            return f"The path {why}."
        sources = [("query string", request.GET)]
        if request.method == "POST" and not request.path_info.startswith(API_PREFIX):
            sources.append(("form", request.POST))
        for name, data in sources:
            for key, values in data.lists():
                for text in (key, *values):
                    if why := text_problem(text):
                        return f"The {name} field {key[:64]!r} {why}."
        return None
