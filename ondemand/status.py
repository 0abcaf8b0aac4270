"""The `ondemand` field of deployment views: the site's scheduler's counters (its owner's,
asked on a link of its own, where this process is one of several; else this process's own
controller's), or what the record alone says where nothing answers."""

from __future__ import annotations

import logging
import threading
import time
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
FRESH_S = 0.5  # a page that shows a deployment twice (its state and its counts) asks once
QUIET_S = 5.0  # after a failed question: the record alone, without a wait each row
ASK_TIMEOUT_S = 2.0
_asked_at: dict[tuple[int, str], tuple[float, dict[str, Any]]] = {}
_down_until = [0.0]
_lock = threading.Lock()


def _asked(deployment: Deployment) -> dict[str, Any]:
    """The owner's counts of the deployment (a link of its own: /api runs in threads)."""
    now = time.monotonic()
    key = (deployment.pk, deployment.state)
    with _lock:
        cached = _asked_at.get(key)
        if cached is not None and now - cached[0] < FRESH_S:
            return cached[1]
        quiet = now < _down_until[0]
    if not quiet:
        asked = {"op": "status", "deployment": deployment.pk, "state": deployment.state}
        try:
            found = client.ask_blocking(asked, ASK_TIMEOUT_S)
        except (OSError, ValueError, GatewayError, wire.WireError) as exc:
            log.warning("the scheduler did not say %s's counts: %r", deployment.name, exc)
            _down_until[0] = now + QUIET_S
        else:
            shown = {**found, **wait_figures.shown(found.pop("waiting", None))}
            with _lock:
                if len(_asked_at) > 4096:
                    _asked_at.clear()
                _asked_at[key] = (now, shown)
            return shown
    return {**describe(Entry(), deployment.state), **wait_figures.shown(None)}


def status_of(deployment: Deployment) -> dict[str, Any] | None:
    if not deployment.is_on_demand:
        return None
    if settings.MSHIP_SCHEDULER_URL:
        return _asked(deployment)
    ctl = next((c for c in controllers() if deployment.pk in c.entries), None)
    entry = ctl.entries[deployment.pk] if ctl is not None else Entry()
    figures = wait_figures.of(ctl, deployment.pk) if ctl is not None else None
    return {**describe(entry, deployment.state), **wait_figures.shown(figures)}
