from django.conf import settings
from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import URLPattern, URLResolver, include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts.api import TokenCreateApi
from agents.orchestrator.urls import api_urls as orchestrator_api
from agents.orchestrator.urls import page_urls as orchestrator_pages
from config.health import healthz
from sagas.api.urls import fallback as api_fallback

api_v1: list[URLPattern | URLResolver] = [
    path("auth/token/", TokenCreateApi.as_view(), name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("journal.urls")),
    path("", include("sagas.api.urls")),
    *orchestrator_api,
    *api_fallback,  # last: anything else under /api/v1/ is a problem+json 404
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    # daphne serves no files and there is no proxy in front of `make run`: the app serves its own
    # few static files (dashboard and admin) from the finders, in DEBUG and in tests alike.
    re_path(rf"^{settings.STATIC_URL.strip('/')}/(?P<path>.+)$", serve_static, {"insecure": True}),
    *orchestrator_pages,
    path("", include("sagas.urls")),
]
