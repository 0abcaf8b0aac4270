from django.urls import include, path
from rest_framework.routers import DefaultRouter

from deployments.api import views
from deployments.api.apply_view import apply_file
from deployments.api.store_views import StoredModelViewSet

router = DefaultRouter()
router.register("deployments", views.DeploymentViewSet)
router.register("audit", views.AuditEntryViewSet)
router.register("events", views.DeploymentEventViewSet)
router.register("stored-models", StoredModelViewSet)

urlpatterns = [
    path("host", views.host, name="host"),
    path("apply", apply_file, name="apply"),
    path("prometheus/targets", views.prometheus_targets, name="prometheus-targets"),
    path("", include(router.urls)),
]
