"""Budgets of keys and teams, checked in memory on every request of a key that has one.

A request is refused (429 budget_exceeded) when what its key, or its key's team, used in the
budget's period reaches the limit: the totals every process used, read again every
MSHIP_BUDGET_REFRESH_S (Redis counters where REDIS_URL is set, openai_api/usage/counters.py;
the usage table otherwise, as often as the ledger flushes), plus what this process used
since.

A token budget is reserved, not only checked: a request is let in only where the most it can
spend (its prompt, estimated from its size, and the tokens it may generate, times `n`) fits
what is left after what the requests under way hold; it holds that much until it ends, when
what it spent counts instead. 200 requests at once of a key with 1,000 tokens a day no longer
all pass a check that none of them has counted in yet.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

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


@dataclass(slots=True)
class Reservation:
    """The tokens a request under way holds of its key's and team's budgets."""

    owners: tuple[Owner, ...]
    tokens: int
    released: bool = False
    site_id: str | None = None  # its hold at the site's scheduler, where there is one


class SiteBudgets(Protocol):
    """The site scheduler's reservations, where this process is one of several
    (ondemand/scheduler/reservations.py): every process's requests under way held in one
    place."""

    async def reserve(self, owners: list[dict[str, Any]], tokens: int) -> str | None: ...

    def release(self, reservation_id: str) -> None: ...


class Budgets:
    def __init__(self) -> None:
        self.totals: dict[Tally, float] = {}  # every process's, as last read
        self.local: dict[Tally, float] = {}  # this process's since
        self.held: dict[str, int] = {}  # owner ref: tokens reserved by requests under way
        self.site: SiteBudgets | None = None
        self.lock = threading.Lock()
        self.watched: dict[str, Owner] = {}  # owners whose requests this process has seen
        self.watched_at: dict[str, float] = {}  # owner ref: when first seen (monotonic)
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

    def check(self, owners: tuple[Owner, ...], tokens: int = 0) -> None:
        """429 when a key or its team (`owners`) is out of a budget, or its token budget has
        not `tokens` left beside what its requests under way hold (503 where the totals
        cannot be read and MSHIP_BUDGET_FAILURE is closed)."""
        periods = self.periods()
        self.watch(owners)  # new, or its budgets changed
        for owner in owners:
            for field, what, period, limit in owner.limits:
                used = self.used((owner.ref, what, periods[period]))
                if used >= limit:
                    raise exceeded(owner, field, what, period, used, limit)
                held = self.held.get(owner.ref, 0) if what == "tokens" else 0
                if what == "tokens" and tokens and used + held + tokens > limit:
                    raise cannot_fit(owner, field, period, limit - used, held, tokens)
        if self.stale() and settings.MSHIP_BUDGET_FAILURE == "closed":
            raise GatewayError(
                503,
                "Budgets cannot be checked now (their counts cannot be read); try again later.",
                "budget_unavailable",
                {"retry-after": "5"},
            )

    def reserve(self, owners: tuple[Owner, ...], tokens: int) -> Reservation | None:
        """Checked as `check` does, and `tokens` held for the request until `release`."""
        with self.lock:  # the check and the hold as one: no other thread admits between
            self.check(owners, tokens)
            if tokens <= 0 or not any(
                what == "tokens" for o in owners for _, what, _, _ in o.limits
            ):
                return None
            for owner in owners:
                self.held[owner.ref] = self.held.get(owner.ref, 0) + tokens
        return Reservation(owners, tokens)

    async def reserve_on_site(self, reservation: Reservation) -> None:
        """The reservation held by the site's scheduler too, where there is one: it judges
        with every process's holds (its 429 where they leave too little)."""
        if self.site is None:
            return
        periods = self.periods()
        said = [
            {
                "kind": o.kind,
                "ref": o.ref,
                "name": o.name,
                "limits": [
                    [field, period, limit, self.used((o.ref, what, periods[period]))]
                    for field, what, period, limit in o.limits
                    if what == "tokens"
                ],
            }
            for o in reservation.owners
        ]
        try:
            reservation.site_id = await self.site.reserve(said, reservation.tokens)
        except BaseException:
            self.release(reservation)
            raise

    def release(self, reservation: Reservation) -> None:
        """The request ended (what it spent counts from now on): its hold goes, once."""
        if reservation.site_id is not None and self.site is not None and not reservation.released:
            self.site.release(reservation.site_id)
        with self.lock:
            if reservation.released:
                return
            reservation.released = True
            for owner in reservation.owners:
                left = self.held.get(owner.ref, 0) - reservation.tokens
                if left > 0:
                    self.held[owner.ref] = left
                else:
                    self.held.pop(owner.ref, None)

    def live(self, owner: Owner) -> bool:
        """Whether the owner's figures here are the check's: it was watched before the totals
        were last read, so they include its use by every process (GET /v1/usage reads the
        usage table for one that is not)."""
        since = self.watched_at.get(owner.ref)
        return since is not None and self.synced_at > since

    def stale(self) -> bool:
        return time.monotonic() - self.synced_at > settings.MSHIP_BUDGET_STALE_S

    def watch(self, owners: tuple[Owner, ...]) -> None:
        """Their totals read, and what this process counts of them sent, from now on."""
        for owner in owners:
            if self.watched.get(owner.ref) != owner:
                self.watched[owner.ref] = owner
                self.watched_at.setdefault(owner.ref, time.monotonic())

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
            self.held.clear()
            self.watched.clear()
            self.watched_at.clear()
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


def cannot_fit(
    owner: Owner, field: str, period: str, left: float, held: int, tokens: int
) -> GatewayError:
    """The request may spend more tokens than its budget has left. Where requests under way
    hold some, they come back as those end (a short Retry-After); else at the reset."""
    ends = resets_at(period, datetime.now(UTC))
    retry = 5 if held else max(1, int((ends - datetime.now(UTC)).total_seconds()) + 1)
    under_way = f", {held:,} of them held by its requests under way" if held else ""
    return GatewayError(
        429,
        f"This request may use up to {tokens:,} tokens (its prompt and the most it may"
        f" generate), and the {owner.kind} {owner.name!r} has {max(left, 0):,.0f} left of its"
        f" budget {field} this {period} (UTC){under_way}. Ask for fewer tokens (max_tokens),"
        " or try again later.",
        "budget_exceeded",
        {"retry-after": str(retry), "x-modelship-budget": f"{owner.kind}:{field}"},
    )


budgets = Budgets()
