from django.urls import path
from rest_framework.routers import SimpleRouter

from openai_api.api import views
from openai_api.api.usage_view import UsageView

router = SimpleRouter()
router.register("keys", views.ApiKeyViewSet)
router.register("teams", views.TeamViewSet)

urlpatterns = [path("usage/", UsageView.as_view(), name="usage"), *router.urls]
