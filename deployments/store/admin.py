"""The admin's Models page: the store's models with their format, size and metadata, each
pull's progress kept current (store_live.js polls /api/stored-models/), the store's disk,
and a form that pulls. Rows are read-only: a pull is asked, never edited; deleting one a
deployment uses is refused with its reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html

from common.redact import redact_urls
from deployments import display
from deployments.host_access import RUN_ARBITRARY_ENGINE
from deployments.refusals import OperationRefused
from deployments.store import pulls
from deployments.store.disk import disk_summary
from deployments.store.models import PullState, StoredModel
from deployments.store.refs import suggested_for
from deployments.store.sources import default_name
from deployments.store.users import users_of

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from django.http import HttpRequest, HttpResponse

STATE_COLOURS = {"ready": "ready", "pulling": "starting", "queued": "planned", "failed": "failed"}


def human_size(count: int | None) -> str:
    if count is None:
        return "—"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


class PullForm(forms.ModelForm):  # type: ignore[type-arg]
    """Asks for a pull as it is cleaned, so a refusal is the form's error."""

    name = forms.CharField(
        required=False, help_text="Its name in the store (store:NAME). Empty: from the source."
    )
    include = forms.CharField(
        required=False,
        help_text="A repository's files to take, comma-separated globs (e.g. *Q4_K_M.gguf).",
    )
    request: HttpRequest

    class Meta:
        model = StoredModel
        fields = ("source", "name", "include")
        widgets = {"source": forms.TextInput(attrs={"size": 80})}

    def _post_clean(self) -> None:
        """Nothing of the model's own checks: pulls.ask checked the values and made (or
        found) the row, whose name is then taken."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        patterns = [p.strip() for p in (data.get("include") or "").split(",") if p.strip()]
        user = self.request.user
        try:
            self.asked = pulls.ask(
                data.get("name") or default_name(data["source"]),
                data["source"],
                patterns,
                actor=user.get_username(),
                user=user,
                may_reach_host=user.has_perm(RUN_ARBITRARY_ENGINE),
            )
        except OperationRefused as exc:
            fields = {f: m for f, m in exc.fields.items() if f in self.fields}
            if not fields:
                raise forms.ValidationError(str(exc)) from exc
            for field, texts in fields.items():
                for text in texts:
                    self.add_error(field, text)
        return data


@admin.register(StoredModel)
class StoredModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "name",
        "progress",
        "format",
        "size",
        "parameters",
        "quantization",
        "context",
        "loader",
        "used_by",
        "shown_source",
    )
    list_filter = ("state", "format")
    # Not the source: a search would tell its credentials a character at a time.
    search_fields = ("name",)
    form = PullForm
    readonly_fields = (
        "name",
        "shown_source",
        "include",
        "state",
        "shown_error",
        "path",
        "format",
        "size",
        "details",
        "checksums",
        "used_by",
        "created_by",
        "created",
        "started_at",
        "finished_at",
    )

    class Media:
        js = ("modelship/store_live.js",)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"request": request})  # this request's own class

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("source", "name", "include") if obj is None else self.readonly_fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.readonly_fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # asked, never edited: the page shows it

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        asked = form.asked.model  # pulls.ask made (or found) the row
        obj.pk, obj.name = asked.pk, asked.name
        if asked.state == PullState.READY:
            messages.info(request, f"{asked.name} is already in the store.")

    def delete_model(self, request: HttpRequest, obj: StoredModel) -> None:
        try:
            pulls.remove(obj, actor=request.user.get_username(), user=request.user)
        except OperationRefused as exc:
            messages.error(request, str(exc))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[StoredModel]) -> None:
        for model in queryset:
            self.delete_model(request, model)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        disk = disk_summary()
        extra = {
            "store_disk": {
                "path": disk["path"],
                "models": disk["models"],
                "used": human_size(disk["used_bytes"]),
                "free": human_size(disk["free_bytes"]),
                "total": human_size(disk["total_bytes"]),
            }
        }
        return super().changelist_view(request, {**(extra_context or {}), **extra})

    @admin.display(description="State")
    def progress(self, obj: StoredModel) -> str:
        text = obj.state
        if obj.state == PullState.PULLING and obj.bytes_total:
            text = f"pulling {100 * obj.bytes_done / obj.bytes_total:.0f}%"
        return format_html(
            '<span class="ms-badge" style="background:{}" data-store-id="{}" data-state="{}"'
            ' title="{}">{}</span>',
            display.colour(STATE_COLOURS.get(obj.state, "planned")),
            obj.pk,
            obj.state,
            redact_urls(obj.error)[:300],
            text,
        )

    # A source's credentials (user:password@, ?token=) are its pull's alone: never shown,
    # nor in an error that quotes the URL.
    @admin.display(description="Source")
    def shown_source(self, obj: StoredModel) -> str:
        return str(redact_urls(obj.source))

    @admin.display(description="Error")
    def shown_error(self, obj: StoredModel) -> str:
        return str(redact_urls(obj.error))

    @admin.display(description="Size")
    def size(self, obj: StoredModel) -> str:
        return human_size(obj.size_bytes)

    @admin.display(description="Parameters")
    def parameters(self, obj: StoredModel) -> str:
        count = obj.details.get("parameters")
        return f"{count / 1e6:,.1f} M" if isinstance(count, int) and count else "—"

    @admin.display(description="Quantization")
    def quantization(self, obj: StoredModel) -> str:
        return str(obj.details.get("quantization") or "—")

    @admin.display(description="Context")
    def context(self, obj: StoredModel) -> str:
        return str(obj.details.get("context_length") or "—")

    @admin.display(description="Loader")
    def loader(self, obj: StoredModel) -> str:
        return suggested_for(obj)[0] or "—"

    @admin.display(description="Used by")
    def used_by(self, obj: StoredModel) -> str:
        return ", ".join(users_of(obj)) or "—"
