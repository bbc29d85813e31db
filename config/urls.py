from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts.api import TokenCreateApi
from accounts.views import ThrottledLoginView
from agents.orchestrator.urls import api_urls as orchestrator_api
from agents.orchestrator.urls import page_urls as orchestrator_pages
from config.exposition import MetricsView
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
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("admin/", admin.site.urls),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),  # before Django's own login
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    *orchestrator_pages,
    path("", include("sagas.urls")),
]

# With DEBUG off (production, and the tests) a crash answers templates/500.html, or problem+json
# under /api/: never a traceback.
handler500 = "config.problems.server_error"
# A request Django refuses while a middleware reads it (a body past its limit, too many fields or
# files): problem+json under /api/ too, with the limit.
handler400 = "config.problems.bad_request"
