from django.apps import AppConfig

from deployments import hooks


class OndemandConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ondemand"

    def ready(self) -> None:
        # The control plane calls these hooks; it imports nothing of this app. Imported here,
        # once the apps are loaded: these modules use the models.
        from ondemand import (  # noqa: PLC0415 - apps loaded
            litellm,
            live,
            preparing,
            registry,
            status,
            tasks,
        )
        from openai_api.dispatch import dispatcher  # noqa: PLC0415 - apps loaded
        from openai_api.rate_limits import rate_limiter  # noqa: PLC0415 - apps loaded
        from openai_api.usage import gpu_time  # noqa: PLC0415 - apps loaded
        from openai_api.usage.budgets import budgets  # noqa: PLC0415 - apps loaded

        hooks.register(hooks.listing_changed, tasks.request_litellm_sync)
        hooks.register(hooks.state_changed, live.publish_state_change)
        hooks.register(hooks.start_preparing, preparing.tell)
        hooks.reports.ondemand_status = status.status_of
        hooks.reports.litellm_statuses = litellm.deployment_statuses
        hooks.reports.litellm_status = litellm.deployment_status
        hooks.reports.litellm_site_status = litellm.status_now
        dispatcher.on_demand = registry.ControllerSlots()
        dispatcher.places = registry.SitePlaces()
        dispatcher.site = registry.SiteChoices()
        gpu_time.site = registry.SiteMeter()
        rate_limiter.site = registry.SiteWindows()
        budgets.site = registry.SiteBudgets()
