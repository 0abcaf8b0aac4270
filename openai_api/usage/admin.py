"""The admin's teams, and what the keys' and teams' pages show of their budgets: each one
set, as "tokens/day 1,234 of 10,000 (12%)"."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Count
from django.utils.html import format_html_join

from openai_api import teams
from openai_api.usage.models import BUDGETS, Team
from openai_api.usage.report import budget_status, budget_text

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from django.http import HttpRequest
    from django.utils.safestring import SafeString

    from openai_api.models import ApiKey

BUDGET_FIELDS = tuple(field for field, _, _ in BUDGETS)
BUDGETS_FIELDSET: Any = (
    "Budgets",
    {
        "fields": (*BUDGET_FIELDS, "budget_use"),
        "description": "Per UTC day or calendar month; empty: no limit. Past one, requests get"
        " 429 budget_exceeded until it resets.",
    },
)


def budget_use(obj: ApiKey | Team) -> SafeString | str:
    """Each budget it sets and how much of it is used, a line each; "-" where it sets none."""
    if obj.pk is None:
        return "-"
    lines = budget_text(budget_status(obj))
    return format_html_join("\n", "<div>{}</div>", ((line,) for line in lines)) if lines else "-"


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "key_count", "budgets_used", "created")
    search_fields = ("name", "description")
    readonly_fields = ("budget_use", "created")
    fieldsets = ((None, {"fields": ("name", "description", "created")}), BUDGETS_FIELDSET)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        rows: QuerySet[Team] = super().get_queryset(request)
        return rows.annotate(key_count=Count("keys"))

    @admin.display(description="keys", ordering="key_count")
    def key_count(self, obj: Team) -> int:
        return int(getattr(obj, "key_count", 0))

    @admin.display(description="budgets used")
    def budgets_used(self, obj: Team) -> SafeString | str:
        return budget_use(obj)

    @admin.display(description="used now")
    def budget_use(self, obj: Team) -> SafeString | str:
        return budget_use(obj)

    def save_model(self, request: HttpRequest, obj: Team, form: Any, change: bool) -> None:
        # Through the one door for teams: audited as the signed-in user.
        fields = {name: form.cleaned_data[name] for name in form.changed_data}
        if change:
            teams.change(request.user, Team.objects.get(pk=obj.pk), **fields)
            return
        made = teams.create(request.user, **{name: getattr(obj, name) for name in form.fields})
        obj.pk = made.pk

    def delete_model(self, request: HttpRequest, obj: Team) -> None:
        teams.delete(request.user, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Team]) -> None:
        for team in queryset:
            teams.delete(request.user, team)
