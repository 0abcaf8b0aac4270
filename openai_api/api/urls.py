from rest_framework.routers import SimpleRouter

from openai_api.api import views

router = SimpleRouter()
router.register("keys", views.ApiKeyViewSet)

urlpatterns = router.urls
