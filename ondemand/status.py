"""The `ondemand` field of deployment views: the controller's counters where this process
runs the gateway, else what the record alone says."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment
from ondemand.controller import SLEEPING, View


def status_of(deployment: Deployment) -> dict[str, Any] | None:
    if not deployment.is_on_demand:
        return None
    from ondemand.runtime import _controllers

    view = View(
        id=deployment.pk,
        name=deployment.name,
        state=deployment.state,
        on_demand=True,
        need_gib=0.0,
        idle_timeout_s=float(deployment.effective_idle_timeout_s),
    )
    for controller in list(_controllers.values()):
        if deployment.pk in controller.entries:
            return controller.status(view, deployment.pk)
    if deployment.state == "failed":
        phase = "failed"
    elif deployment.state in SLEEPING or deployment.state == "planned":
        phase = "sleeping"
    else:
        phase = "idle"
    return {"inflight": 0, "queued": 0, "last_request_at": None, "phase": phase}
