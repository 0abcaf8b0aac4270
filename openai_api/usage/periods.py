"""Budget periods: the UTC day and the UTC calendar month, named and ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

PERIODS = ("day", "month")


def start_of(period: str, now: datetime) -> datetime:
    now = now.astimezone(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)


def resets_at(period: str, now: datetime) -> datetime:
    start = start_of(period, now)
    if period == "day":
        return start + timedelta(days=1)
    return (start + timedelta(days=32)).replace(day=1)


def period_id(period: str, now: datetime) -> str:
    """The period `now` is in, as a name: 2026-12-06 (a day) or 2026-12 (a month)."""
    now = now.astimezone(UTC)
    return f"{now:%Y-%m-%d}" if period == "day" else f"{now:%Y-%m}"
