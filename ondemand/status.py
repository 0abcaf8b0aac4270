"""The `ondemand` field of deployment views: the site's scheduler's counters (its owner's,
asked on a link of its own, where this process is one of several; else this process's own
controller's), or what the record alone says where nothing answers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.conf import settings

from ondemand import wait_figures
from ondemand.registry import controllers
from ondemand.scheduler import client, wire
from ondemand.state import Entry, describe
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from deployments.models import Deployment

log = logging.getLogger(__name__)


def status_of(deployment: Deployment) -> dict[str, Any] | None:
    if not deployment.is_on_demand:
        return None
    if settings.MSHIP_SCHEDULER_URL:
        try:
            asked = {"op": "status", "deployment": deployment.pk, "state": deployment.state}
            found = client.ask_blocking(asked)
        except (OSError, ValueError, GatewayError, wire.WireError) as exc:
            log.warning("the scheduler did not say %s's counts: %r", deployment.name, exc)
            return {**describe(Entry(), deployment.state), **wait_figures.shown(None)}
        return {**found, **wait_figures.shown(found.pop("waiting", None))}
    ctl = next((c for c in controllers() if deployment.pk in c.entries), None)
    entry = ctl.entries[deployment.pk] if ctl is not None else Entry()
    figures = wait_figures.of(ctl, deployment.pk) if ctl is not None else None
    return {**describe(entry, deployment.state), **wait_figures.shown(figures)}
