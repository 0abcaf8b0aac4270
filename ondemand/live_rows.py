"""What the live admin shows of each deployment and of the host, read in one go: the rows
from the database, the on-demand counts from this process's controllers (the gateway runs in
the process that serves the admin), the memory each holds from the host's summary."""

from __future__ import annotations

from typing import Any

from deployments import display
from deployments.memory import host_summary
from deployments.models import Deployment
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
    return rows, {field: host[field] for field in HOST_FIELDS}


def row_of(deployment: Deployment, holding_gib: float) -> Row:
    status = status_of(deployment)
    inflight = display.in_flight(deployment, status)
    return {
        "id": deployment.pk,
        "name": deployment.name,
        "state": deployment.state,
        "colour": display.colour(deployment.state),
        "reason": deployment.state_reason[:300],
        "mode": display.mode_label(deployment),
        "phase": None if status is None else status["phase"],
        "activity": display.activity_label(status, inflight),
        "inflight": inflight,
        "queued": 0 if status is None else status["queued"],
        "last_request_at": display.last_request_at(deployment, status),
        "holding_gib": holding_gib,
        "gpus": display.gpu_label(deployment.gpus),
        "engine": deployment.engine_url or "-",
        "state_changed_at": display.moment(deployment.state_changed_at),
    }


def with_counts(row: Row, status: dict[str, Any]) -> Row:
    """A row with the on-demand counts a gateway published (ondemand/counters.py)."""
    last = status.get("last_request_at") or row["last_request_at"]
    return {
        **row,
        "phase": status["phase"],
        "activity": display.ondemand_label(status),
        "inflight": status["inflight"],
        "queued": status["queued"],
        "last_request_at": last,
    }
