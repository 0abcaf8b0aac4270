from django.apps import AppConfig


class OndemandConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ondemand"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from deployments.models import Deployment

        def removed(**_: object) -> None:
            from ondemand.tasks import request_litellm_sync

            request_litellm_sync()  # its entries leave LiteLLM

        post_delete.connect(removed, sender=Deployment, dispatch_uid="ondemand-litellm-removed")
