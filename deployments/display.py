"""How a deployment's state reads to an operator: the words and colours the admin's pages
show, whether rendered by Django or updated live by the page's script (ondemand/live.py
sends the same words)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import formats, timezone

from common import metrics
from deployments import sleep_tiers
from deployments.models import STARTABLE_STATES, State

if TYPE_CHECKING:
    from datetime import datetime

    from deployments.models import Deployment

# A failure's reason can hold a command line and an engine's last lines: shown whole (on
# hover in the list, on its page, on the dashboard), within reason.
REASON_CHARS = 20_000

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


def activity_label(
    inflight: int, queued: int, position: int | None = None, eta_s: float | None = None
) -> str:
    """Requests in flight and waiting (on demand: for its start or for memory), with the
    model's place in the memory queue and the estimate of its start where known."""
    parts = [f"{inflight} in flight"] if inflight else []
    if queued:
        parts.append(f"{queued} queued")
    if position:
        parts.append(f"place {position} in the queue")
    if eta_s is not None:
        parts.append(f"ready in about {round(eta_s)} s")
    return " · ".join(parts) or "—"


def waiting_of(status: dict[str, Any] | None) -> tuple[int | None, float | None]:
    """The place in the memory queue and the start's estimate an on-demand status carries."""
    if status is None:
        return None, None
    return status.get("position"), status.get("eta_s")


def state_label(
    state: str,
    on_demand: bool,
    phase: str | None,
    start_phase: str,
    launched: bool,
    sleep_level: int | None = None,
) -> str:
    """A deployment's state in the one vocabulary of the admin, the API and the CLI: the
    state, then what it does in it where that says more (an on-demand deployment with no
    engine is idle, not "sleeping"; one that is put to sleep is "asleep")."""
    # No engine: what a start begins from (on demand starts a failed one too).
    if start_phase and state in STARTABLE_STATES:
        return f"starting · {start_phase}"
    if state == State.STARTING:
        return "starting · " + ("waiting for health" if launched else "launching")
    if phase == "queued" and state in (*STARTABLE_STATES, State.ASLEEP):
        return "queued · waiting for memory"
    if phase == "starting_for_request" and state in STARTABLE_STATES:
        return "starting · for a request"
    if phase == "starting_for_request" and state == State.ASLEEP:
        return "waking · for a request"
    if on_demand and state == State.STOPPED:
        return "stopped · idle"
    if on_demand and state == State.PLANNED:
        return "planned · idle"
    if state == State.ASLEEP and (tier := sleep_tiers.label(sleep_level)):
        return f"asleep · {tier}"
    return str(state)


def label_of(deployment: Deployment, status: dict[str, Any] | None) -> str:
    if deployment.adapter_of is not None:  # no engine of its own: its base's state is its
        base = deployment.adapter_of
        return f"adapter of {base.name}: " + label_of(base, None)
    return state_label(
        deployment.state,
        deployment.is_on_demand,
        None if status is None else status["phase"],
        deployment.start_phase,
        bool(deployment.engine_urls),
        deployment.sleep_level,
    )


def short_url(url: str) -> str:
    """An engine's address as a narrow column shows it: host and port (the path and the
    scheme are on hover)."""
    if not url:
        return "-"
    return url.split("://", 1)[-1].split("/", 1)[0]


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
