"""The cross-process guarantee that a busy on-demand model is never stopped.

The gateway (ASGI server) hands out slots from memory; stops are approved in other processes
(the reaper in the django-q cluster). They meet on the deployment row: the gateway keeps
`lease_until` at least an idle timeout past its last slot, extending it ahead of time with
a conditional UPDATE (so not once per request), and a stop is approved only, under the row's
lock, once the lease has passed. A grant and a stop therefore never interleave, and a dead
gateway leaks nothing: its lease lapses.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from deployments.models import Deployment, State

# A lease is renewed when less than this is left of it.
RENEW_MARGIN_S = 30.0


def extend(deployment_id: int, seconds: float) -> datetime | None:
    """Hold the lease `seconds` from now while the deployment is ready; None when it is not
    (a stop was approved first)."""
    until = timezone.now() + timedelta(seconds=seconds)
    try:
        held = Deployment.objects.filter(pk=deployment_id, state=State.READY).update(
            lease_until=until
        )
    finally:
        connection.close()
    return until if held else None


def lapsed(row: Deployment, now: datetime | None = None) -> bool:
    """Whether a stop may be approved as far as the gateways are concerned."""
    return row.lease_until is None or row.lease_until <= (now or timezone.now())
