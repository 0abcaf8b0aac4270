from django.apps import AppConfig


class OndemandConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ondemand"
