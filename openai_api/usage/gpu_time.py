"""GPU-seconds, divided among the requests that shared an engine (README, "Usage and
budgets").

A replica holding `share` GPUs for `dt` seconds while `n` requests of this process are in
flight on it gives each of them share * dt / n. Kept as one running sum per replica, the
GPU-seconds one request would have had from the replica's first request until now: a request
notes it when it starts and is charged the difference when it ends, so starting and ending
cost a few float operations however many requests share the replica.

Where several gateway processes (or hosts) send requests to one replica, the division is the
site scheduler's (ondemand/scheduler/): each process tells its owner when a request begins
and ends on a replica with a GPU share, and the owner's one meter divides among the site's
requests. Each process keeps its own meter as well: its figure is the one charged where the
owner cannot answer (a restart, an outage), divided among that process's own requests.
A replica without a GPU share costs no hop."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from openai_api.catalog import Snapshot


@dataclass(slots=True)
class Replica:
    share: float = 0.0
    inflight: int = 0
    accrued: float = 0.0  # GPU-seconds per request in flight, summed since its first
    at: float = 0.0

    def advance(self, now: float) -> None:
        if self.inflight:
            self.accrued += self.share * (now - self.at) / self.inflight
        self.at = now


Ticket = tuple[Replica, float]


class GpuMeter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.replicas: dict[str, Replica] = {}
        self.shares: dict[str, float] = {}
        self.seen: object = None  # the route table the shares were read from

    def begin(
        self, url: str, snapshot: Snapshot | None = None, share: float | None = None
    ) -> Ticket:
        """A request starts on the replica at `url` (an engine base URL); its GPU share is
        read from the route table (`snapshot`), or said (`share`: the site's meter hears it
        from the gateway that routed the request)."""
        if snapshot is not None and snapshot is not self.seen:
            self.read_shares(snapshot)
        replica = self.replicas.get(url)
        if replica is None:
            replica = self.replicas[url] = Replica(self.shares.get(url, 0.0), at=self.clock())
        replica.advance(self.clock())
        if share is not None:
            replica.share = share
        replica.inflight += 1
        return replica, replica.accrued

    def end(self, ticket: Ticket) -> float:
        """The request ends: the GPU-seconds that were its part."""
        replica, began = ticket
        replica.advance(self.clock())
        replica.inflight -= 1
        return replica.accrued - began

    def read_shares(self, snapshot: Snapshot) -> None:
        """Each replica's share from a new route table: time until now at the old one."""
        self.seen = snapshot
        self.shares = {
            url: share
            for route in snapshot.models
            for url, share in zip(route.urls, route.gpu_shares, strict=False)
        }
        now = self.clock()
        for url, replica in list(self.replicas.items()):
            replica.advance(now)
            if url in self.shares:
                replica.share = self.shares[url]
            elif not replica.inflight:
                del self.replicas[url]  # an engine no route points at any more
            # else: gone from the routes, still serving: its share holds until it drains


class SiteShare(Protocol):
    """A request's part of a replica's GPU time on the site's meter."""

    async def spent(self, here: float) -> float:
        """Its GPU-seconds by the site's division; `here`, this process's, where the site's
        meter cannot say."""
        ...


class SiteMeter(Protocol):
    """The site's meter where this process is one of several: the on-demand app registers
    it at start-up (this package imports nothing of it)."""

    def begin(self, url: str, share: float) -> SiteShare | None:
        """None: this process's own meter is the site's."""
        ...


meter = GpuMeter()
site: SiteMeter | None = None
