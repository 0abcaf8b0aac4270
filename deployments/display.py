"""How a deployment's state reads to an operator: the words and colours the admin's pages
show, whether rendered by Django or updated live by the page's script (ondemand/live.py
sends the same words)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import formats, timezone

from common import metrics
from deployments.models import State

if TYPE_CHECKING:
    from datetime import datetime

    from deployments.models import Deployment

BADGE_COLOURS: dict[str, str] = {
    State.PLANNED: "#6c757d",
    State.STARTING: "#0d6efd",
    State.READY: "#198754",
    State.ASLEEP: "#6f42c1",
    State.STOPPING: "#fd7e14",
    State.STOPPED: "#495057",
    State.FAILED: "#dc3545",
}


def colour(state: str) -> str:
    return BADGE_COLOURS.get(state, "#333")


def in_flight(deployment: Deployment, status: dict[str, Any] | None) -> int:
    """On demand, the controller's count; always on, this process's requests to it (the
    server that shows the admin is the gateway that forwards them)."""
    return metrics.inflight_here(deployment.name) if status is None else int(status["inflight"])


def last_request_at(deployment: Deployment, status: dict[str, Any] | None) -> float | None:
    """When this process last sent it a request: the gateway's time or the on-demand
    controller's, whichever is later; None when never."""
    times = (metrics.last_request_at.get(deployment.name), (status or {}).get("last_request_at"))
    return max((t for t in times if t), default=None)


def mode_label(deployment: Deployment) -> str:
    label = "system" if deployment.system else deployment.effective_mode.replace("_", " ")
    pending = deployment.pending_mode
    return f"{label} → {pending.replace('_', ' ')}" if pending else label


def gpu_label(gpus: list[list[int]] | None) -> str:
    """Each replica's GPUs, as placed at its start."""
    if not gpus:
        return "—"
    replicas = [", ".join(str(i) for i in devices) or "none" for devices in gpus]
    if len(replicas) == 1:
        return replicas[0]
    return "; ".join(f"replica {n}: {r}" for n, r in enumerate(replicas))


def ondemand_label(status: dict[str, Any] | None) -> str:
    if status is None:
        return "—"
    return f"{status['phase']} ({status['inflight']} in flight, {status['queued']} queued)"


def activity_label(status: dict[str, Any] | None, inflight: int) -> str:
    """On demand, the phase and its counts; always on, the requests in flight."""
    if status is not None:
        return ondemand_label(status)
    return f"{inflight} in flight" if inflight else "—"


def ago(timestamp: float | None, now: float) -> str:
    if not timestamp:
        return "never"
    seconds = max(0, int(now - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def moment(when: datetime | None) -> str:
    """A time as the admin's lists show one (the site's time zone and format)."""
    if when is None:
        return "-"
    return str(formats.localize(timezone.localtime(when) if timezone.is_aware(when) else when))
