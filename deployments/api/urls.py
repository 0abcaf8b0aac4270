from django.urls import include, path
from rest_framework.routers import DefaultRouter

from deployments.api import views

router = DefaultRouter()
router.register("deployments", views.DeploymentViewSet)
router.register("audit", views.AuditEntryViewSet)
router.register("events", views.DeploymentEventViewSet)

urlpatterns = [
    path("host", views.host, name="host"),
    path("prometheus/targets", views.prometheus_targets, name="prometheus-targets"),
    path("", include(router.urls)),
]
