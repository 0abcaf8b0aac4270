from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic.base import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from modelship_site.health import health, readyz
from modelship_site.metrics import metrics

urlpatterns = [
    path("health", health, name="health"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("favicon.ico", RedirectView.as_view(url=static("modelship/favicon.svg"))),
    path("api/", include("openai_api.api.urls")),
    path("api/", include("deployments.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]

# /api answers a path no route matches, and an error outside its views, in JSON.
handler404 = "modelship_site.api_errors.not_found"
handler500 = "modelship_site.api_errors.server_error"
