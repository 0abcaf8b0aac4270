"""The on-demand counts of every gateway process, summed for the live admin.

Each process publishes its own counts of a deployment (in flight, queued, its phase) with
its process id when they change, and again every KEEPALIVE_S while they are not zero. A page
keeps the latest of each process and shows their sum; a process that has said nothing for
STALE_S (it died, or its host did) stops counting.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import TYPE_CHECKING, Any

from ondemand.state import LEASE_RENEW_S

if TYPE_CHECKING:
    from collections.abc import Callable

KEEPALIVE_S = LEASE_RENEW_S / 2
STALE_S = 3 * KEEPALIVE_S
# This process, as its messages name it (a pid alone repeats across hosts).
PROCESS = f"{os.getpid()}-{secrets.token_hex(4)}"
# The phase shown when processes differ: the most pressing one any of them is in.
PRESSING = ("queued", "starting_for_request", "serving")

Status = dict[str, Any]


class CountSums:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.latest: dict[int, dict[str, tuple[float, Status]]] = {}

    def add(self, deployment_id: int, status: Status) -> Status:
        by_process = self.latest.setdefault(deployment_id, {})
        by_process[str(status.get("process", ""))] = (self.clock(), status)
        summed = self.summed(deployment_id)
        assert summed is not None  # the one just added is fresh
        return summed

    def summed(self, deployment_id: int) -> Status | None:
        """The sum over the processes still heard from; None when none is."""
        now = self.clock()
        by_process = self.latest.get(deployment_id, {})
        for process, (heard, _) in list(by_process.items()):
            if now - heard > STALE_S:
                del by_process[process]
        fresh = [status for _, status in sorted(by_process.values(), key=lambda p: p[0])]
        if not fresh:
            return None
        phases = {status["phase"] for status in fresh}
        since = [s["queued_since"] for s in fresh if s.get("queued_since")]
        etas = [s["eta_s"] for s in fresh if s.get("eta_s") is not None]
        places = [s["position"] for s in fresh if s.get("position")]
        return {
            "inflight": sum(int(status["inflight"]) for status in fresh),
            "queued": sum(int(status["queued"]) for status in fresh),
            "last_request_at": max((s["last_request_at"] or 0 for s in fresh), default=0) or None,
            "queued_since": min(since, default=None),
            "eta_s": max(etas, default=None),  # the slowest process's estimate
            "position": min(places, default=None),
            "phase": next((p for p in PRESSING if p in phases), fresh[-1]["phase"]),
        }
