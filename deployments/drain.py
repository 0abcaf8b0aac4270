"""Replaced or removed engines let finish what they serve before they stop (a blue-green
replace, a replica the autoscaler takes away)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
from django.conf import settings

from deployments import engine_secrets
from deployments.engine_metrics import read_load
from deployments.loaders import get_loader

if TYPE_CHECKING:
    from deployments.models import Deployment
    from deployments.runtimes import Handle


def drain(deployment: Deployment, handles: list[Handle]) -> None:
    """Let replaced engines finish what they serve before they stop.

    Routers that read the switch late may still send a request for a moment, so the old
    engines live at least the drain grace; then until their gauges show nothing running or
    waiting (an engine without gauges gets the grace only), at most the drain timeout.
    """
    loader = get_loader(deployment.loader)
    start = time.monotonic()
    grace_end = start + settings.MSHIP_DRAIN_GRACE_S
    deadline = start + max(settings.MSHIP_DRAIN_TIMEOUT_S, settings.MSHIP_DRAIN_GRACE_S)
    busy = list(handles)
    with httpx.Client(timeout=2.0, auth=engine_secrets.EngineAuth(handles)) as client:
        while time.monotonic() < deadline:
            busy = [
                h
                for h in busy
                if (load := read_load(client, h["url"], loader)) is not None and not load.idle
            ]
            if not busy and time.monotonic() >= grace_end:
                return
            time.sleep(0.1)
