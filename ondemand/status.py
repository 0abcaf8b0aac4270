"""The `ondemand` field of deployment views: the controller's counters where this process
runs the gateway, else what the record alone says."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ondemand import wait_figures
from ondemand.registry import controllers
from ondemand.state import Entry, describe

if TYPE_CHECKING:
    from deployments.models import Deployment


def status_of(deployment: Deployment) -> dict[str, Any] | None:
    if not deployment.is_on_demand:
        return None
    ctl = next((c for c in controllers() if deployment.pk in c.entries), None)
    entry = ctl.entries[deployment.pk] if ctl is not None else Entry()
    figures = wait_figures.of(ctl, deployment.pk) if ctl is not None else None
    return {**describe(entry, deployment.state), **wait_figures.shown(figures)}
