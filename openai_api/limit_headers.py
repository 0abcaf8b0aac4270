"""The x-ratelimit-* headers of a key's answers: what its requests-per-minute limit and its
(and its team's) budgets have left, on every /v1 answer where one applies, errors included.

The names are OpenAI's where they mean the same: `x-ratelimit-{limit,remaining,reset}-requests`
for the key's requests per minute. Budgets have no OpenAI counterpart (OpenAI's token limits
are per minute): `x-ratelimit-{limit,remaining,reset}-{tokens,gpu-seconds,requests}-{day,month}`,
the tightest of the key's and its team's for each. Resets are said as OpenAI says them, as Go
prints a duration ("1s", "6m0s", "20ms", "13h2m5s").

Hot path: worked out once, as the answer starts, from figures in memory (the rate check's
own answer, the budgets' counts): no query, no round trip of its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from openai_api.usage.budgets import budgets
from openai_api.usage.periods import resets_at

if TYPE_CHECKING:
    from openai_api.catalog import Key

Headers = list[tuple[bytes, bytes]]
WINDOW_S = 60.0  # a requests-per-minute window


@dataclass(frozen=True, slots=True)
class Left:
    """A key's per-minute window after the request the rate check just let in (or refused:
    `remaining` 0)."""

    limit: int
    remaining: int
    # Until the window's oldest arrival leaves it (one more request is free then; a 429's
    # Retry-After). Where the window is not known exactly, a bound (rate_limits.py).
    reset_s: float


def duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers say it (Go's notation): 0.02 -> "20ms", 1 ->
    "1s", 360 -> "6m0s", 3723.5 -> "1h2m3.5s"."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    secs = f"{whole}.{fraction:03d}".rstrip("0") if fraction else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def requests_headers(left: Left) -> Headers:
    return [
        (b"x-ratelimit-limit-requests", str(left.limit).encode()),
        (b"x-ratelimit-remaining-requests", str(left.remaining).encode()),
        (b"x-ratelimit-reset-requests", duration(left.reset_s).encode()),
    ]


def figure(what: str, value: float) -> str:
    """Tokens and requests whole (what is left rounded down), GPU-seconds to the millisecond."""
    if what == "gpu_seconds":
        return f"{math.floor(value * 1000) / 1000:.3f}".rstrip("0").rstrip(".")
    return str(math.floor(value))


def budget_headers(key: Key, now: float) -> Headers:
    """For each thing a budget counts and its period, the tightest of the key's and its
    team's budgets: its limit, what is left (as the budget check counts it: every process's
    totals as last read plus this process's own since; a request under way counts once it
    ends, its requests_per_day as it is let in) and the time to its reset."""
    periods = budgets.periods()
    tightest: dict[tuple[str, str], tuple[float, int]] = {}
    for owner in key.budget_owners:
        for _, what, period, limit in owner.limits:
            left = limit - budgets.used((owner.ref, what, periods[period]))
            found = tightest.get((what, period))
            if found is None or left < found[0]:
                tightest[(what, period)] = (left, limit)
    at = datetime.fromtimestamp(now, UTC)
    headers: Headers = []
    for (what, period), (left, limit) in tightest.items():
        name = f"{what.replace('_', '-')}-{period}"
        reset = (resets_at(period, at) - at).total_seconds()
        headers += [
            (f"x-ratelimit-limit-{name}".encode(), str(limit).encode()),
            (f"x-ratelimit-remaining-{name}".encode(), figure(what, max(left, 0.0)).encode()),
            (f"x-ratelimit-reset-{name}".encode(), duration(reset).encode()),
        ]
    return headers


class Limits:
    """One request's limits as its answer tells them: the key's budgets from the start, its
    per-minute window once the rate check let it in (`rpm`; a refusal says its own)."""

    __slots__ = ("key", "rpm")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.rpm: Left | None = None

    def headers(self) -> Headers:
        found = requests_headers(self.rpm) if self.rpm is not None else []
        if self.key.budget_owners:
            found += budget_headers(self.key, time.time())
        return found


# Told to a browser's script too (CORS).
EXPOSED = b", ".join(
    f"x-ratelimit-{part}-{name}".encode()
    for name in (
        "requests",
        "tokens-day",
        "tokens-month",
        "gpu-seconds-day",
        "gpu-seconds-month",
        "requests-day",
    )
    for part in ("limit", "remaining", "reset")
)
