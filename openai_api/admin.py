from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from openai_api.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "visible_prefix",
        "created",
        "last_used",
        "revoked",
        "requests_per_minute",
    )
    list_filter = ("revoked",)
    search_fields = ("name", "prefix")
    readonly_fields = ("visible_prefix", "created", "last_used")
    fields = (
        "name",
        "visible_prefix",
        "allowed_models",
        "requests_per_minute",
        "revoked",
        "created",
        "last_used",
    )
    actions = ("revoke",)

    @admin.display(description="key begins")
    def visible_prefix(self, obj: ApiKey) -> str:
        return f"msk-{obj.prefix}-…" if obj.prefix else "(made on save)"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new key: made here so its secret can be shown this once.
        key, secret = ApiKey.issue(
            obj.name,
            allowed_models=obj.allowed_models,
            requests_per_minute=obj.requests_per_minute,
            revoked=obj.revoked,
        )
        obj.pk, obj.prefix = key.pk, key.prefix
        self.message_user(
            request, f"The key for {key.name} (shown once, copy it now): {secret}", messages.WARNING
        )

    @admin.action(description="Revoke", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        count = queryset.update(revoked=True)
        self.message_user(request, f"{count} key(s) revoked.")
