from __future__ import annotations

import time
from contextvars import ContextVar
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from deployments import admin_options, display, hooks, host_access, operations
from deployments.admin_change import STATE_FIELDS, DeploymentPage
from deployments.admin_fields import NamesField, OptionalJSONField
from deployments.engine_logs import tails
from deployments.loaders import LOADERS, EngineSpec, get_loader
from deployments.memory import host_summary, need_gib
from deployments.models import (
    STARTABLE_STATES,
    Deployment,
    Mode,
    State,
)
from deployments.operations import Outcome
from deployments.refusals import OperationRefused
from deployments.store import admin as store_admin  # noqa: F401  (the Models page)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from django.db.models import QuerySet
    from django.http import HttpRequest

ADMIN_LOG_LINES = 50


# What each deployment holds, by id, while the list is rendered (changelist_view).
HOLDING: ContextVar[Mapping[int, float]] = ContextVar("holding", default=MappingProxyType({}))


def live_cell(obj: Deployment, field: str, text: str) -> str:
    return format_html('<span data-live="{}" data-id="{}">{}</span>', field, obj.pk, text)


def run_operation(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: Iterable[Deployment],
    operation: Callable[[Deployment, Any], Any],
    verb: str,
) -> None:
    for deployment in queryset:
        try:
            outcome = operation(deployment, request.user)
        except OperationRefused as exc:
            modeladmin.message_user(request, f"{deployment.name}: {exc}", messages.ERROR)
            continue
        if verb != "mode" and outcome != Outcome.QUEUED:
            # Nothing was done: it is in that state already (a start of a ready one).
            modeladmin.message_user(
                request, f"{deployment.name} is {outcome}: nothing to {verb}", messages.WARNING
            )
            continue
        modeladmin.message_user(request, f"{deployment.name}: {verb} {outcome}")


@admin.register(Deployment)
class DeploymentAdmin(DeploymentPage, admin.ModelAdmin):
    # Grouped so that the list fits 1,280 px: what it is, its state, its requests, its memory.
    list_display = ("deployment", "state_badge", "mode_label", "activity", "memory", "engine")
    list_filter = ("state", "loader", "usecase", "runtime", "mode", "system")
    search_fields = ("name", "model")
    readonly_fields = STATE_FIELDS  # the page's State section (admin_change.py)
    actions = ("start", "stop", "sleep", "wake", "switch_on_demand", "switch_always_on")
    form = admin_options.deployment_form()

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """A new deployment is offered on demand where LiteLLM is enabled and its last sync
        succeeded (the on-demand seed's deploy wizard): its name stays callable while it is
        stopped. Elsewhere, and in /api, the default is always on."""
        initial: dict[str, Any] = super().get_changeform_initial_data(request)
        litellm = hooks.reports.litellm_site_status() or {}
        if litellm.get("litellm_ready"):
            initial.setdefault("mode", Mode.ON_DEMAND)
        return initial

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        host = host_summary()
        # The held column reads the summary the page shows above the list (one read).
        token = HOLDING.set({d["id"]: d["holding_gib"] for d in host["deployments"]})
        try:
            return super().changelist_view(request, {**(extra_context or {}), "host": host})
        finally:
            HOLDING.reset(token)

    @admin.display(description="deployment", ordering="name")
    def deployment(self, obj: Deployment) -> str:
        return format_html(
            '<a class="ms-name" href="{}" title="{}">{}</a><div class="ms-sub">{} · {} · {}</div>',
            reverse("admin:deployments_deployment_change", args=[obj.pk]),
            obj.name,
            obj.name,
            obj.loader,
            obj.usecase,
            obj.runtime,
        )

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Deployment) -> str:
        # data-live: the page's script (static/modelship/live.js) keeps the cell current.
        status = hooks.reports.ondemand_status(obj)
        since = obj.state_changed_at.timestamp() if obj.state_changed_at else None
        return format_html(
            '<span class="ms-badge" data-live="state" data-id="{}" style="background:{}" '
            'title="{}">{}</span><div class="ms-sub">changed <span data-live="state_since" '
            'data-id="{}" data-time="{}" title="{}">{}</span></div>',
            obj.pk,
            display.colour(obj.state),
            obj.state_reason[: display.REASON_CHARS],
            display.label_of(obj, status),
            obj.pk,
            since or "",
            display.moment(obj.state_changed_at),
            display.ago(since, time.time()) if since else "—",
        )

    @admin.display(description="mode")
    def mode_label(self, obj: Deployment) -> str:
        return live_cell(obj, "mode", display.mode_label(obj))

    @admin.display(description="requests")
    def activity(self, obj: Deployment) -> str:
        status = hooks.reports.ondemand_status(obj)
        inflight = display.in_flight(obj, status)
        queued = 0 if status is None else status["queued"]
        last = display.last_request_at(obj, status)
        return format_html(
            '{}<div class="ms-sub">last <span data-live="last_request_at" data-id="{}" '
            'data-time="{}">{}</span></div>',
            live_cell(
                obj,
                "activity",
                display.activity_label(inflight, queued, *display.waiting_of(status)),
            ),
            obj.pk,
            last or "",
            display.ago(last, time.time()),
        )

    @admin.display(description="memory (GiB) held / needs")
    def memory(self, obj: Deployment) -> str:
        holding = HOLDING.get().get(obj.pk, 0.0)
        return format_html(
            '{} / {}<div class="ms-sub">GPUs {}</div>',
            live_cell(obj, "holding_gib", f"{holding:.2f}"),
            f"{need_gib(obj):.2f}",
            live_cell(obj, "gpus", display.gpu_label(obj.gpus)),
        )

    @admin.display(description="judged idle by")
    def idle_signal(self, obj: Deployment) -> str:
        """On demand, what says it is idle: the gateway's slots, and the engine's load
        gauges where its loader has them."""
        if obj.pk is None or not obj.is_on_demand or obj.loader not in LOADERS:
            return "—"
        return LOADERS[obj.loader].idle_signal

    @admin.display(description="when idle")
    def idle_action(self, obj: Deployment) -> str:
        """On demand, what an idle engine is given: sleep where it sleeps, else a stop, and
        why not sleep where sleep mode was asked for and the engine here has none."""
        if obj.pk is None or not obj.is_on_demand or obj.loader not in LOADERS:
            return "—"
        return LOADERS[obj.loader].idle_action(EngineSpec.of(obj))

    @admin.display(description="engine")
    def engine(self, obj: Deployment) -> str:
        url = obj.engine_url or ""
        return format_html(
            '<span data-live="engine" data-id="{}" title="{}">{}</span>',
            obj.pk,
            url,
            display.short_url(url),
        )

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "aliases":
            return NamesField(
                required=False,
                help_text="Other names it answers to, comma-separated (e.g. chat, assistant).",
                widget=forms.TextInput(attrs={"size": 60}),
            )
        if db_field.name == "command":
            return OptionalJSONField(
                required=False,
                help_text="Empty: the loader's command line. Else a JSON list of arguments,"
                ' e.g. ["python", "-m", "my_engine", "--port", "{port}"].',
                widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
            )
        if db_field.name == "config":
            field = super().formfield_for_dbfield(db_field, request, **kwargs)
            assert field is not None
            field.help_text = (
                "The options of a loader without fields of its own below (vllm: any vLLM"
                " engine argument), as a JSON object (in a models.yaml: vllm_engine_kwargs)."
            )
            return field
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Without the permission, what runs on the host is shown, not edited (the loader's
        # `binary` inside config is checked when the form is saved).
        host = () if host_access.may_run_anything(request.user) else ("image", "command")
        return (*self.readonly_fields, "idle_signal", "idle_action", *host)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        user = request.user
        current = Deployment.objects.get(pk=obj.pk) if obj is not None and obj.pk else None

        class CheckedForm(form):  # type: ignore[misc, valid-type]
            def clean(self) -> dict[str, Any]:
                # The refusals /api answers with, as this form's errors (operations.check).
                data: dict[str, Any] = super().clean()
                if self.errors:
                    return data
                # A new one is checked whole; an edit by what the form changed.
                fields = data if current is None else self.changed_data
                changes = {f: data[f] for f in fields if f in operations.SETTABLE_FIELDS}
                if current is not None and data.get("config") != current.config:
                    changes["config"] = data["config"]  # gathered from the option fields
                try:
                    operations.check(current, changes, user)
                except OperationRefused as exc:
                    if not exc.fields:
                        self.add_error(None, str(exc))
                    for field, problems in exc.fields.items():
                        for problem in problems:
                            self.add_error(self.field_of(field, problem, data), problem)
                return data

            def field_of(self, field: str, problem: str, data: dict[str, Any]) -> str | None:
                """Next to the field it is about: an option's own where it names one, the
                form's top for a config whose box the page hides."""
                name = field.split(".")[0]
                loader = data.get("loader") or ""
                if name == "config" and admin_options.has_options(loader):
                    return admin_options.field_of_problem(loader, problem)
                return name if name in self.fields else None

        return CheckedForm

    def save_model(self, request: HttpRequest, obj: Deployment, form: Any, change: bool) -> None:
        if change:
            saved = operations.update(obj, request.user)
            obj.mode, obj.pending_mode = saved.mode, saved.pending_mode
        else:
            operations.create(obj, request.user)

    def delete_model(self, request: HttpRequest, obj: Deployment) -> None:
        operations.remove(obj, request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        for obj in queryset:
            operations.remove(obj, request.user)

    @admin.action(description="Start", permissions=["change"])
    def start(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        press(self, request, queryset, "start")

    @admin.action(description="Stop", permissions=["change"])
    def stop(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        press(self, request, queryset, "stop")

    @admin.action(description="Sleep", permissions=["change"])
    def sleep(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        press(self, request, queryset, "sleep")

    @admin.action(description="Wake", permissions=["change"])
    def wake(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        press(self, request, queryset, "wake")

    @admin.action(description="Switch to on demand", permissions=["change"])
    def switch_on_demand(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        press(self, request, queryset, "on_demand")

    @admin.action(description="Switch to always on", permissions=["change"])
    def switch_always_on(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        press(self, request, queryset, "always_on")

    def get_urls(self) -> list[URLPattern]:
        operate = path(
            "<path:object_id>/operate/",
            self.admin_site.admin_view(self.operate_view),
            name="deployments_deployment_operate",
        )
        return [operate, *super().get_urls()]

    def operate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The buttons on a deployment's page: one operation, then back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404("no such deployment")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        button = request.POST.get("op", "")
        if button not in BUTTONS:
            self.message_user(request, f"no such operation: {button!r}", messages.ERROR)
        else:
            press(self, request, [obj], button)
        return redirect("admin:deployments_deployment_change", obj.pk)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        # The live panel of an existing deployment's page (change_form.html).
        if obj is not None and obj.pk:
            context["live"] = {
                "buttons": buttons_for(obj),
                "may_operate": self.has_change_permission(request, obj),
                "tails": tails(obj, ADMIN_LOG_LINES),
                "replicas": range(obj.replica_count),
                "mode": display.mode_label(obj),
                "colour": display.colour(obj.state),
                "label": display.label_of(obj, hooks.reports.ondemand_status(obj)),
                "need_gib": need_gib(obj),
            }
        return super().render_change_form(request, context, add, change, form_url, obj)


def to_mode(mode: str) -> Callable[[Deployment, Any], str]:
    """A mode switch's button: what it switched to, or that it was in that mode already (a
    stale page's button: nothing is switched)."""

    def switch(deployment: Deployment, user: Any) -> str:
        if operations.in_mode(deployment, mode):
            return f"already {mode}"
        deployment = operations.set_mode(deployment, mode, user)
        return (deployment.pending_mode and "always on once started") or deployment.effective_mode

    return switch


class Button(NamedTuple):
    operation: Callable[[Deployment, Any], Any]
    verb: str  # the word its message uses
    label: str
    states: tuple[str, ...] = ()  # the states it does something in (none: any)
    mode: str = ""  # a mode switch: the mode it switches to
    confirm: str = ""  # asked before it is pressed


# The operations a deployment's page offers as buttons (and the list as actions).
BUTTONS: dict[str, Button] = {
    "start": Button(operations.start, "start", "Start", tuple(STARTABLE_STATES)),
    "stop": Button(
        operations.stop,
        "stop",
        "Stop",
        (State.STARTING, State.READY, State.ASLEEP, State.FAILED),
        confirm="Stop {name}? Requests to it fail until it runs again.",
    ),
    "sleep": Button(operations.sleep, "sleep", "Sleep", (State.READY,)),
    "wake": Button(operations.wake, "wake", "Wake", (State.ASLEEP,)),
    "on_demand": Button(
        to_mode(Mode.ON_DEMAND), "mode", "Switch to on demand", mode=Mode.ON_DEMAND
    ),
    "always_on": Button(
        to_mode(Mode.ALWAYS_ON), "mode", "Switch to always on", mode=Mode.ALWAYS_ON
    ),
}


def buttons_for(deployment: Deployment) -> list[dict[str, Any]]:
    """The page's buttons: each enabled in the states it acts in (the live panel keeps that
    so as the state changes), sleep only where the engine sleeps, no switch to the mode it
    is in."""
    sleeps = get_loader(deployment.loader).can_sleep(EngineSpec.of(deployment))
    shown = []
    for op, button in BUTTONS.items():
        if button.mode and button.mode == deployment.effective_mode and not deployment.pending_mode:
            continue
        if op == "sleep" and not sleeps:
            continue
        enabled = not button.states or deployment.state in button.states
        shown.append(
            {
                "op": op,
                "label": button.label,
                "enabled": enabled,
                "states": " ".join(button.states),
                "confirm": button.confirm.format(name=deployment.name),
            }
        )
    return shown


def press(
    modeladmin: admin.ModelAdmin, request: HttpRequest, rows: Iterable[Deployment], button: str
) -> None:
    run_operation(modeladmin, request, rows, BUTTONS[button].operation, BUTTONS[button].verb)


# The /api tokens' and the audit trail's admins, kept in modules of their own (this one is
# long enough).
from deployments import admin_audit, admin_tokens  # noqa: E402, F401
