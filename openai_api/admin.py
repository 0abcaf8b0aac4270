from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages

from deployments import audit
from openai_api.models import ApiKey

if TYPE_CHECKING:
    from django.http import HttpRequest


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
            before = key_snapshot(ApiKey.objects.get(pk=obj.pk))
            super().save_model(request, obj, form, change)
            action = "api_key_revoke" if obj.revoked and not before["revoked"] else "api_key_change"
            audit_key(request, obj, action, before)
            return
        # A new key: made here so its secret can be shown this once.
        key, secret = ApiKey.issue(
            obj.name,
            allowed_models=obj.allowed_models,
            requests_per_minute=obj.requests_per_minute,
            revoked=obj.revoked,
        )
        obj.pk, obj.prefix = key.pk, key.prefix
        audit_key(request, key, "api_key_create", None)
        # Messages live in the session (MESSAGE_STORAGE), never in a cookie: the key is
        # shown once, on the next page, and stays on the server until then.
        self.message_user(
            request, f"The key for {key.name} (shown once, copy it now): {secret}", messages.WARNING
        )

    @admin.action(description="Revoke", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        count = 0
        for key in queryset.filter(revoked=False):
            before = key_snapshot(key)
            key.revoked = True
            key.save(update_fields=["revoked"])
            audit_key(request, key, "api_key_revoke", before)
            count += 1
        self.message_user(request, f"{count} key(s) revoked.")


def key_snapshot(key: ApiKey) -> dict[str, Any]:
    """What an audit row shows of a key: never its secret or hash."""
    return {
        "name": key.name,
        "prefix": key.prefix,
        "allowed_models": key.allowed_models,
        "requests_per_minute": key.requests_per_minute,
        "revoked": key.revoked,
    }


def audit_key(
    request: HttpRequest, key: ApiKey, action: str, before: dict[str, Any] | None
) -> None:
    audit.record(
        action,
        None,
        user=request.user,
        before=before,
        after=key_snapshot(key),
        object_repr=f"API key {key.name} (msk-{key.prefix}-…)",
    )
