"""A deployment's page in the admin, as an operator reads it: fields under human labels, the
chosen loader's options right after the loader, what runs now as labelled rows (each
replica's engine address, process or container, GPUs, log) instead of JSON, the whole
failure reason folded under its first line, and no state section on the add form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from deployments import admin_options, display, hooks
from deployments.memory import estimate_report

if TYPE_CHECKING:
    from django.http import HttpRequest

    from deployments.models import Deployment

# Labels in the operator's words (the API keeps the field names).
LABELS = {
    "usecase": "Use case",
    "num_replicas": "Replicas",
    "autoscaling_config": "Autoscaling",
    "responses": "Responses API answered by",
    "memory_gib": "Memory (GiB)",
    "num_gpus": "GPUs",
    "ray_resources": "Ray resources",
    "idle_timeout_s": "Idle timeout (s)",
    "system": "System deployment",
}

# What a replica's handle says, in the order a reader wants it, under its label.
HANDLE_ROWS = (
    ("url", "engine address"),
    ("pid", "process id"),
    ("container_name", "container"),
    ("container_id", "container id"),
    ("image", "image"),
    ("job", "Ray job"),
    ("node_id", "Ray node"),
    ("gpus", "GPUs"),
    ("log", "log file"),
)

SHORT_REASON = 200  # a reason longer than this is folded under its start

STATE_FIELDS = (
    "memory_estimate",
    "memory_seen",
    "state_now",
    "reason",
    "engines",
    "running_fingerprint",
    "pending_mode",
    "created",
    "updated",
    "state_changed_at",
)


def fieldsets(add: bool) -> list[tuple[str | None, dict[str, Any]]]:
    """The form's groups: what it is, its loader's options, the engine, memory, lifecycle,
    and (on an existing deployment's page) its state."""
    groups: list[tuple[str | None, dict[str, Any]]] = [
        (
            None,
            {"fields": ("name", "aliases", "model", "adapter_of", "loader", "usecase", "runtime")},
        ),
        *admin_options.fieldsets(),
        (
            "Engine",
            {
                "fields": (
                    "image",
                    "command",
                    "config",
                    "num_replicas",
                    "autoscaling_config",
                    "responses",
                )
            },
        ),
        (
            "Memory",
            {
                "fields": ("memory_gib", "num_gpus", "ray_resources")
                + (() if add else ("memory_estimate",))
            },
        ),
        (
            "Lifecycle",
            {
                "fields": (
                    "mode",
                    "idle_timeout_s",
                    "evictable",
                    "preload",
                    "priority",
                    "max_concurrency",
                    "system",
                    "idle_signal",
                    "idle_action",
                )
            },
        ),
    ]
    if not add:
        groups.append(("State", {"fields": STATE_FIELDS}))
    return groups


class DeploymentPage:
    """The page's groups and read-only rows, for DeploymentAdmin."""

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return fieldsets(add=obj is None)

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_dbfield(db_field, request, **kwargs)  # type: ignore[misc]
        if field is not None and db_field.name in LABELS:
            field.label = LABELS[db_field.name]
        return field

    @admin.display(description="State")
    def state_now(self, obj: Deployment) -> str:
        return format_html(
            '<span class="ms-badge" style="background:{}">{}</span>',
            display.colour(obj.state),
            display.label_of(obj, hooks.reports.ondemand_status(obj)),
        )

    @admin.display(description="Memory estimate")
    def memory_estimate(self, obj: Deployment) -> str:
        """Beside memory_gib: what the model's metadata says its engine will hold."""
        report = estimate_report(obj)
        if report is None:
            return "— (its model is not on this host, or its size says nothing)"
        text = (
            f"{report['gib']:g} GiB: weights {report['weights_gib']:g} + cache"
            f" {report['cache_gib']:g} + overhead {report['overhead_gib']:g}, from"
            f" {report['basis']}"
        )
        if report.get("sequences_fit") is not None:
            text += f"; {report['sequences_fit']} full-length sequences of KV cache fit"
        if report["warning"]:
            return format_html(
                '{}<br><strong class="errornote">{}</strong>', text, report["warning"]
            )
        return text

    @admin.display(description="Memory learned and measured")
    def memory_seen(self, obj: Deployment) -> str:
        """Declared against what an out-of-memory start taught and what the engine held."""
        parts = [f"declared {obj.memory_gib:g} GiB" if obj.memory_gib is not None else "declared —"]
        if obj.learned_gib is not None:
            on = f" on {obj.learned_on}" if obj.learned_on else ""
            parts.append(f"learned {obj.learned_gib:g} GiB{on} (an out-of-memory start)")
        if obj.measured_gib is not None:
            parts.append(f"measured {obj.measured_gib:g} GiB at its last start")
        return "; ".join(parts)

    @admin.display(description="Reason")
    def reason(self, obj: Deployment) -> str:
        """The whole reason, folded under its first line where it has more."""
        text = obj.state_reason[: display.REASON_CHARS]
        if not text:
            return "—"
        first, _, rest = text.partition("\n")
        if not rest and len(text) <= SHORT_REASON:
            return format_html('<span class="ms-reason-line">{}</span>', text)
        head = first if len(first) <= SHORT_REASON else first[:SHORT_REASON] + "…"
        return format_html(
            '<details class="ms-reason-block" open><summary>{}</summary><pre>{}</pre></details>',
            head,
            text,
        )

    @admin.display(description="Engines")
    def engines(self, obj: Deployment) -> str:
        replicas = (obj.runtime_handle or {}).get("replicas") or []
        if not replicas:
            return "— (no engine runs)"
        blocks = []
        for handle in replicas:
            rows = format_html_join(
                "",
                "<tr><th>{}</th><td>{}</td></tr>",
                (
                    (label, display.gpu_label([handle[key]]) if key == "gpus" else handle[key])
                    for key, label in HANDLE_ROWS
                    if handle.get(key) not in (None, "", [])
                ),
            )
            blocks.append(
                format_html(
                    '<table class="ms-engine"><caption>replica {} · {}</caption>{}</table>',
                    handle.get("replica", 0),
                    handle.get("runtime", obj.runtime),
                    rows,
                )
            )
        return format_html_join("", "{}", ((block,) for block in blocks))
