"""The `ondemand` field of deployment views: the controller's counters where this process
runs the gateway, else what the record alone says."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ondemand.registry import controllers
from ondemand.state import Entry, describe

if TYPE_CHECKING:
    from deployments.models import Deployment


def status_of(deployment: Deployment) -> dict[str, Any] | None:
    if not deployment.is_on_demand:
        return None
    entry = next(
        (c.entries[deployment.pk] for c in controllers() if deployment.pk in c.entries),
        Entry(),
    )
    return describe(entry, deployment.state)
