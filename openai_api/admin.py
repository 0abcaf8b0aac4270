from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages

from openai_api import keys
from openai_api.models import ApiKey
from openai_api.usage.admin import BUDGET_FIELDS, BUDGETS_FIELDSET, budget_use

if TYPE_CHECKING:
    from django.http import HttpRequest
    from django.utils.safestring import SafeString


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "visible_prefix",
        "status",
        "rate",
        "team",
        "budgets_used",
        "last_used",
        "created",
    )
    list_filter = ("revoked", "team")
    list_select_related = ("team",)
    search_fields = ("name", "prefix")
    readonly_fields = ("visible_prefix", "created", "last_used", "budget_use")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "visible_prefix",
                    "team",
                    "allowed_models",
                    "requests_per_minute",
                    "priority",
                    "max_concurrency",
                    "revoked",
                    "created",
                    "last_used",
                )
            },
        ),
        BUDGETS_FIELDSET,
    )
    actions = ("revoke",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """A key's team and budgets are for whoever may change teams: one who may only
        change keys cannot lift a budget or take a key out of its team's."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if request.user.has_perm("openai_api.change_team"):
            return fields
        return (*fields, "team", *BUDGET_FIELDS)

    @admin.display(description="budgets used")
    def budgets_used(self, obj: ApiKey) -> SafeString | str:
        return budget_use(obj)

    @admin.display(description="used now")
    def budget_use(self, obj: ApiKey) -> SafeString | str:
        return budget_use(obj)

    @admin.display(description="status", ordering="revoked")
    def status(self, obj: ApiKey) -> str:
        # Words: a boolean column shows an active key as a red cross (revoked: False).
        return "revoked" if obj.revoked else "active"

    @admin.display(description="rate", ordering="requests_per_minute")
    def rate(self, obj: ApiKey) -> str:
        limit, whose = obj.rate()
        return f"{'no limit' if limit is None else f'{limit:,}/min'} ({whose})"

    @admin.display(description="key begins")
    def visible_prefix(self, obj: ApiKey) -> str:
        return keys.visible(obj) if obj.prefix else "(made on save)"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            fields = {name: getattr(obj, name) for name in form.changed_data}
            keys.change(request.user, ApiKey.objects.get(pk=obj.pk), **fields)
            return
        # A new key: made here so its secret can be shown this once.
        key, secret = keys.issue(
            request.user,
            obj.name,
            allowed_models=obj.allowed_models,
            requests_per_minute=obj.requests_per_minute,
            team=obj.team,
            revoked=obj.revoked,
            **{field: getattr(obj, field) for field in BUDGET_FIELDS},
        )
        obj.pk, obj.prefix = key.pk, key.prefix
        # Messages live in the session (MESSAGE_STORAGE), never in a cookie: the key is
        # shown once, on the next page, and stays on the server until then.
        self.message_user(
            request, f"The key for {key.name} (shown once, copy it now): {secret}", messages.WARNING
        )

    @admin.action(description="Revoke", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        count = sum(keys.revoke(request.user, key) for key in queryset.filter(revoked=False))
        self.message_user(request, f"{count} key(s) revoked.")
