"""Input checks that hold for every request, before any view sees it."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from config.payloads import text_problem

API_PREFIX = "/api/"


class RequireContentLength:
    """Refuse an API request whose body comes without a Content-Length (chunked) with a 411
    `length_required`: the request would otherwise reach its view with an empty body, and an error
    about missing fields where the fields were sent."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        if not (meta.get("HTTP_TRANSFER_ENCODING") and not meta.get("CONTENT_LENGTH")):
            return self.get_response(request)
        if not request.path_info.startswith(API_PREFIX):
            return HttpResponse("length_required: send the body with a Content-Length.", status=411)
        body = {"type": "about:blank", "title": "Length required", "status": 411, "code": "length_required",
                "detail": "Send the body with a Content-Length header (a chunked body is not read)."}  # fmt: skip
        return JsonResponse(body, status=411, content_type="application/problem+json")


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
        if request.path_info.startswith(API_PREFIX):
            body = {"type": "about:blank", "title": "Invalid payload", "status": 400, "code": "invalid_payload",
                    "detail": problem}  # fmt: skip
            return JsonResponse(body, status=400, content_type="application/problem+json")
        return HttpResponse(f"invalid_payload: {problem}", status=400, content_type="text/plain; charset=utf-8")

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
