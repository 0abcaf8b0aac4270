"""What the live admin shows of each deployment and of the host, read in one go: the rows
from the database, the on-demand counts from this process's controllers (the gateway runs in
the process that serves the admin), the memory each holds from the host's summary."""

from __future__ import annotations

from typing import Any

from common.traffic import traffic
from deployments import dashboard, display
from deployments.memory import host_summary, need_gib
from deployments.models import Deployment
from ondemand.registry import controllers
from ondemand.status import status_of

Row = dict[str, Any]

HOST_FIELDS = (
    "capacity_gib",
    "held_gib",
    "free_gib",
    "on_demand_capacity_gib",
    "used_gib",
    "placement",
    "gpus",
)


def snapshot() -> tuple[dict[int, Row], dict[str, Any]]:
    """Every deployment's row by id, and the host panel (memory per GPU)."""
    host = host_summary()
    holding = {d["id"]: d["holding_gib"] for d in host["deployments"]}
    rows = {d.pk: row_of(d, holding.get(d.pk, 0.0)) for d in Deployment.objects.order_by("name")}
    for gone in set(_needs) - set(rows):
        _needs.pop(gone, None)
    return rows, {
        **{field: host[field] for field in HOST_FIELDS},
        "reserved": reserved_for_queue(rows),
        "failures": dashboard.last_failures(),
        "ram": dashboard.host_memory(),
        "traffic": traffic.series(),
    }


# Each deployment's need as of its last change (by id): the snapshot runs every second
# while a page watches, and a need reads the GPUs and may walk a model's folder.
_needs: dict[int, tuple[Any, float]] = {}


def need_of(deployment: Deployment) -> float:
    known = _needs.get(deployment.pk)
    if known is not None and known[0] == deployment.updated:
        return known[1]
    need = round(need_gib(deployment), 3)
    _needs[deployment.pk] = (deployment.updated, need)
    return need


def for_viewer(host: dict[str, Any], sees_events: bool) -> dict[str, Any]:
    """The host panel as one viewer may see it: the last failures are deployment events."""
    return host if sees_events else {**host, "failures": None}


def reserved_for_queue(rows: dict[int, Row]) -> list[dict[str, Any]]:
    """Memory make-room freed for the deployments heading this process's queue, kept for them
    until they start."""
    reserved: dict[int, float] = {}
    for controller in controllers():
        for pk, gib in dict(controller.freed_for).items():  # the event loop changes it
            reserved[pk] = reserved.get(pk, 0.0) + gib
    return [
        {"name": rows[pk]["name"], "gib": round(gib, 3)}
        for pk, gib in sorted(reserved.items())
        if pk in rows and gib > 0
    ]


def row_of(deployment: Deployment, holding_gib: float) -> Row:
    status = status_of(deployment)
    inflight = display.in_flight(deployment, status)
    queued = 0 if status is None else status["queued"]
    position, eta_s = display.waiting_of(status)
    return {
        "id": deployment.pk,
        "name": deployment.name,
        "state": deployment.state,
        "label": display.label_of(deployment, status),
        "colour": display.colour(deployment.state),
        "reason": deployment.state_reason[: display.REASON_CHARS],
        "mode": display.mode_label(deployment),
        "on_demand": deployment.is_on_demand,
        "start_phase": deployment.start_phase,
        "launched": bool(deployment.engine_urls),
        "sleep_level": deployment.sleep_level,
        "phase": None if status is None else status["phase"],
        "activity": display.activity_label(inflight, queued, position, eta_s),
        "inflight": inflight,
        "queued": queued,
        "queued_since": None if status is None else status.get("queued_since"),
        "position": position,
        "eta_s": eta_s,
        "last_request_at": display.last_request_at(deployment, status),
        "idle_timeout_s": deployment.effective_idle_timeout_s if deployment.is_on_demand else None,
        "holding_gib": holding_gib,
        "need_gib": need_of(deployment),
        "gpus": display.gpu_label(deployment.gpus),
        "engine": deployment.engine_url or "-",
        "state_changed_at": display.moment(deployment.state_changed_at),
        "state_changed_ts": changed.timestamp()
        if (changed := deployment.state_changed_at)
        else None,
    }


def with_counts(row: Row, status: dict[str, Any]) -> Row:
    """A row with the on-demand counts a gateway published (ondemand/counters.py)."""
    last = status.get("last_request_at") or row["last_request_at"]
    label = display.state_label(
        row["state"],
        row["on_demand"],
        status["phase"],
        row["start_phase"],
        row["launched"],
        row["sleep_level"],
    )
    return {
        **row,
        "label": label,
        "phase": status["phase"],
        "activity": display.activity_label(
            status["inflight"], status["queued"], status.get("position"), status.get("eta_s")
        ),
        "eta_s": status.get("eta_s"),
        "position": status.get("position"),
        "inflight": status["inflight"],
        "queued": status["queued"],
        "queued_since": status.get("queued_since"),
        "last_request_at": last,
    }
