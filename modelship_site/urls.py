from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from deployments.sign_in import ThrottledAdminLoginForm
from modelship_site.health import health, readyz
from modelship_site.metrics import metrics

admin.site.site_header = "Modelship"
admin.site.site_title = "Modelship"
admin.site.index_title = "Control plane"
# Says so when failed sign-ins have throttled a login (deployments/login_throttle.py).
admin.site.login_form = ThrottledAdminLoginForm

urlpatterns = [
    path("health", health, name="health"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/", include("openai_api.api.urls")),
    path("api/", include("deployments.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]

# /api answers a path no route matches, and an error outside its views, in JSON.
handler404 = "modelship_site.api_errors.not_found"
handler500 = "modelship_site.api_errors.server_error"
