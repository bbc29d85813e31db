"""The app's URLs plus two that crash, for the test that a crash never shows a traceback."""

from django.http import HttpRequest, HttpResponse
from django.urls import path

from config import urls


def crash(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("secret detail that must not leak")


urlpatterns = [path("crash/", crash), path("api/v1/crash/", crash), *urls.urlpatterns]
handler500 = urls.handler500
