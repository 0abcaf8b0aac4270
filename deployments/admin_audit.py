"""The audit trail and the deployments' events in the admin: read-only, to the second, and
an audit entry's change as the fields it changed, each from what to what."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from deployments.models import AuditEntry, DeploymentEvent

if TYPE_CHECKING:
    from django.http import HttpRequest

UNSET = object()


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def to_the_second(obj: Any) -> str:
    return f"{obj.time:%Y-%m-%d %H:%M:%S}"


def changes(entry: AuditEntry) -> list[tuple[str, Any, Any]]:
    """The fields an entry changed: each name, with its value before and after (UNSET where
    one side does not have it: a creation, a deletion)."""
    before = entry.before if isinstance(entry.before, dict) else {}
    after = entry.after if isinstance(entry.after, dict) else {}
    names = [*before, *(k for k in after if k not in before)]
    return [
        (name, before.get(name, UNSET), after.get(name, UNSET))
        for name in names
        if before.get(name, UNSET) != after.get(name, UNSET)
    ]


def as_json(value: Any) -> str:
    return "—" if value is UNSET else json.dumps(value, sort_keys=True, ensure_ascii=False)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("when", "actor", "action", "object_repr", "changed", "request_id")
    list_filter = ("action", "actor")
    search_fields = ("object_repr", "request_id", "text")
    fields = ("when", "actor", "action", "object_repr", "request_id", "change", "text")
    readonly_fields = fields

    @admin.display(description="time", ordering="time")
    def when(self, obj: AuditEntry) -> str:
        return to_the_second(obj)

    @admin.display(description="changed")
    def changed(self, obj: AuditEntry) -> str:
        return ", ".join(name for name, _, _ in changes(obj)) or "-"

    @admin.display(description="change")
    def change(self, obj: AuditEntry) -> str:
        rows = changes(obj)
        if not rows:
            return "-"
        cells = ((name, as_json(was), as_json(now)) for name, was, now in rows)
        body = format_html_join(
            "", "<tr><th>{}</th><td><code>{}</code></td><td><code>{}</code></td></tr>", cells
        )
        return format_html(
            '<table class="ms-diff"><tr><th>field</th><th>before</th><th>after</th></tr>{}</table>',
            body,
        )


@admin.register(DeploymentEvent)
class DeploymentEventAdmin(ReadOnlyAdmin):
    list_display = ("when", "deployment_name", "kind", "actor", "text")
    list_filter = ("kind", "actor")
    search_fields = ("deployment_name", "text")

    @admin.display(description="time", ordering="time")
    def when(self, obj: DeploymentEvent) -> str:
        return to_the_second(obj)
