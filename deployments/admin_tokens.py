"""The admin's list of /api tokens: whose, since when; deleting one revokes it.

A token cannot be read back (only its digest is kept) nor made here: `manage.py api_token
USER` makes one and prints it once. The digest is not shown either: it is no use to a
person, and the list is for revoking.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from deployments.auth_models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "created")
    search_fields = ("user__username",)
    fields = ("user", "created")
    readonly_fields = ("user", "created")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
