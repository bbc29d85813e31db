"""The app's URLs plus some that crash (a page, and where machines call), for the test that a
crash never shows a traceback."""

from django.http import HttpRequest, HttpResponse
from django.urls import path

from config import urls


def crash(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("secret detail that must not leak")


urlpatterns = [
    *(path(f"{prefix}crash/", crash) for prefix in ("", "api/v1/", "a2a/", "mcp/")),
    *urls.urlpatterns,
]
handler500 = urls.handler500
