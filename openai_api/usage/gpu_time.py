"""GPU-seconds, divided among the requests that shared an engine (README, "Usage and
budgets").

A replica holding `share` GPUs for `dt` seconds while `n` requests of this process are in
flight on it gives each of them share * dt / n. Kept as one running sum per replica, the
GPU-seconds one request would have had from the replica's first request until now: a request
notes it when it starts and is charged the difference when it ends, so starting and ending
cost a few float operations however many requests share the replica.

Per gateway process: where several processes send requests to one replica, each divides
among its own (README says what that does to the sums)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

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

    def begin(self, url: str, snapshot: Snapshot | None = None) -> Ticket:
        """A request starts on the replica at `url` (an engine base URL)."""
        if snapshot is not None and snapshot is not self.seen:
            self.read_shares(snapshot)
        replica = self.replicas.get(url)
        if replica is None:
            replica = self.replicas[url] = Replica(self.shares.get(url, 0.0), at=self.clock())
        replica.advance(self.clock())
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


meter = GpuMeter()
