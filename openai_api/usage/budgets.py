"""Budgets of keys and teams, checked in memory on every request of a key that has one.

A request is refused (429 budget_exceeded) when what its key, or its key's team, used in the
budget's period reaches the limit: the totals every process used, read again every
MSHIP_BUDGET_REFRESH_S (Redis counters where REDIS_URL is set, openai_api/usage/counters.py;
the usage table otherwise, as often as the ledger flushes), plus what this process used
since. A request that was let in runs to its end, a stream crossing the line included: it
counts, and the next one is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings

from openai_api.errors import GatewayError
from openai_api.usage.periods import period_id, resets_at

log = logging.getLogger(__name__)

# What a budget counts: a request's tokens (in and out), its GPU-seconds, or the request.
COUNTS = ("tokens", "gpu_seconds", "requests")
UNITS = {"tokens": "tokens", "gpu_seconds": "GPU-seconds", "requests": "requests"}
Tally = tuple[str, str, str]  # owner ref, what is counted, period id


@dataclass(frozen=True)
class Owner:
    """A key or a team that sets budgets, as the route table keeps it."""

    kind: str  # "key" or "team"
    id: int
    ref: str  # a key's prefix, a team's ref: random, so shared Redis counters never mix
    name: str
    limits: tuple[tuple[str, str, str, int], ...]  # (field, what, period, limit)


class Budgets:
    def __init__(self) -> None:
        self.totals: dict[Tally, float] = {}  # every process's, as last read
        self.local: dict[Tally, float] = {}  # this process's since
        self.lock = threading.Lock()
        self.watched: dict[str, Owner] = {}  # owners whose requests this process has seen
        self.synced_at = time.monotonic()
        self._period: tuple[int, dict[str, str]] = (-1, {})

    def periods(self) -> dict[str, str]:
        """The current day's and month's names, worked out once a second."""
        second = int(time.time())
        if self._period[0] != second:
            now = datetime.fromtimestamp(second, UTC)
            self._period = (second, {p: period_id(p, now) for p in ("day", "month")})
        return self._period[1]

    def used(self, tally: Tally) -> float:
        return self.totals.get(tally, 0.0) + self.local.get(tally, 0.0)

    def check(self, owners: tuple[Owner, ...]) -> None:
        """429 when a key or its team (`owners`) is out of a budget (503 where the totals
        cannot be read and MSHIP_BUDGET_FAILURE is closed)."""
        periods = self.periods()
        for owner in owners:
            if self.watched.get(owner.ref) != owner:
                self.watched[owner.ref] = owner  # new, or its budgets changed
            for field, what, period, limit in owner.limits:
                used = self.used((owner.ref, what, periods[period]))
                if used >= limit:
                    raise exceeded(owner, field, what, period, used, limit)
        if self.stale() and settings.MSHIP_BUDGET_FAILURE == "closed":
            raise GatewayError(
                503,
                "Budgets cannot be checked now (their counts cannot be read); try again later.",
                "budget_unavailable",
                {"retry-after": "5"},
            )

    def stale(self) -> bool:
        return time.monotonic() - self.synced_at > settings.MSHIP_BUDGET_STALE_S

    def add(self, owners: tuple[Owner, ...], tokens: int, gpu_seconds: float) -> None:
        """A finished request counts towards its key's and team's budgets (`owners`)."""
        if owners:
            self.count(owners, {"tokens": tokens, "gpu_seconds": gpu_seconds})

    def add_request(self, owners: tuple[Owner, ...]) -> None:
        """A request of the key was let in: its requests_per_day counts it at once."""
        self.count(owners, {"requests": 1})

    def count(self, owners: tuple[Owner, ...], counted: dict[str, float]) -> None:
        periods = self.periods()
        with self.lock:
            for owner in owners:
                for what, amount in counted.items():
                    if amount:
                        for period_name in periods.values():
                            tally = (owner.ref, what, period_name)
                            self.local[tally] = self.local.get(tally, 0.0) + amount

    def settle(self, totals: dict[Tally, float], counted: dict[Tally, float]) -> None:
        """New totals that include `counted` of this process's own: taken out of `local`."""
        with self.lock:
            # The totals first: a check between the two steps (it takes no lock) sees this
            # process's count twice for a moment, never missing.
            self.totals = totals
            for tally, amount in counted.items():
                # Below 0 only where the table held use from before this process watched
                # the owner: the totals have it.
                left = self.local.get(tally, 0.0) - amount
                if left <= 1e-9:
                    self.local.pop(tally, None)
                else:
                    self.local[tally] = left
            self.synced_at = time.monotonic()

    def forget(self) -> None:
        """Everything counted so far (tests, a new site)."""
        with self.lock:
            self.totals.clear()
            self.local.clear()
            self.watched.clear()
            self.synced_at = time.monotonic()


def exceeded(
    owner: Owner, field: str, what: str, period: str, used: float, limit: int
) -> GatewayError:
    ends = resets_at(period, datetime.now(UTC))
    retry = max(1, int((ends - datetime.now(UTC)).total_seconds()) + 1)
    return GatewayError(
        429,
        f"The {owner.kind} {owner.name!r} has used its budget {field}: {used:,.0f} of"
        f" {limit:,} {UNITS[what]} this {period} (UTC). It resets at"
        f" {ends:%Y-%m-%dT%H:%M:%SZ}.",
        "budget_exceeded",
        {"retry-after": str(retry), "x-modelship-budget": f"{owner.kind}:{field}"},
    )


budgets = Budgets()
