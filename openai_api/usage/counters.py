"""Where budgets' totals come from, read again every MSHIP_BUDGET_REFRESH_S by a thread of
each gateway process.

With REDIS_URL: one hash per owner and period (`modelship:budget:{ref}:{period}`) that every
process adds its own counts to (HINCRBYFLOAT) and reads back in the same round trip, so a
process sees the others' use within a refresh interval. Without it: the usage table's sums
for the day and the month, read after each ledger flush (what this process wrote leaves its
local count then) and every refresh; other processes' use shows once they flushed
(MSHIP_USAGE_FLUSH_S).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import F, Q, Sum

from common.redis_errors import with_redis_errors
from openai_api.usage import alerts
from openai_api.usage.budgets import Budgets, Owner, Tally, budgets
from openai_api.usage.ledger import Ledger, Row, ledger
from openai_api.usage.models import GPU, LOAD, REQUESTS, TOKENS_IN, TOKENS_OUT, UsageMinute
from openai_api.usage.periods import PERIODS, period_id, start_of

log = logging.getLogger(__name__)
TTL_S = {"day": 3 * 86400, "month": 40 * 86400}


def redis_name(ref: str, period: str) -> str:
    return f"modelship:budget:{ref}:{period}"


class CounterSync:
    def __init__(self, budgets: Budgets, ledger: Ledger) -> None:
        self.budgets = budgets
        self.ledger = ledger
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.client: Any = None
        ledger.after_write.append(self.written)

    def start(self) -> None:
        with self.lock:
            if self.thread is None:
                # Fresh until the first read fails for MSHIP_BUDGET_STALE_S: a site that
                # ran a while before its first budget is not stale for it.
                self.budgets.synced_at = time.monotonic()
                self.thread = threading.Thread(
                    target=self.run, name="modelship-budgets", daemon=True
                )
                self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.budgets.watched:  # at once, then every refresh interval
                try:
                    self.sync()
                finally:
                    connection.close()
            self.stop.wait(settings.MSHIP_BUDGET_REFRESH_S)

    def sync(self) -> None:
        """Totals read again (and, with Redis, this process's counts added to them)."""
        with self.lock:
            if settings.REDIS_URL:
                self.sync_redis()
            else:
                self.sync_table({})
        alerts.look(self.budgets)

    def written(self, rows: dict[Row, list[float]]) -> None:
        """The ledger wrote `rows`: without Redis, they leave this process's local counts."""
        if settings.REDIS_URL or not self.budgets.watched:
            return
        with self.lock:
            self.sync_table(self.tallies(rows))

    def tallies(self, rows: dict[Row, list[float]]) -> dict[Tally, float]:
        owners = {(o.kind, o.id): o.ref for o in list(self.budgets.watched.values())}
        loads = settings.MSHIP_USAGE_BUDGET_LOADS
        counted: dict[Tally, float] = {}
        for (minute, key_id, team_id, _), values in rows.items():
            when = datetime.fromtimestamp(minute, UTC)
            amounts = {
                "tokens": values[TOKENS_IN] + values[TOKENS_OUT],
                "gpu_seconds": values[GPU] + (values[LOAD] if loads else 0.0),
                "requests": values[REQUESTS],
            }
            for ref in (owners.get(("key", key_id)), owners.get(("team", team_id))):
                if ref is None:
                    continue
                for period in PERIODS:
                    for what, amount in amounts.items():
                        tally = (ref, what, period_id(period, when))
                        counted[tally] = counted.get(tally, 0.0) + amount
        return counted

    def sync_table(self, counted: dict[Tally, float]) -> None:
        try:
            totals = table_totals(list(self.budgets.watched.values()))
        except DatabaseError as exc:
            log.warning("budget totals not read from the usage table: %s", exc)
            return
        self.budgets.settle(totals, counted)

    def sync_redis(self) -> None:
        with self.budgets.lock:
            pushing = dict(self.budgets.local)
        owners = list(self.budgets.watched.values())
        now = datetime.now(UTC)
        try:
            if self.client is None:
                from redis import Redis  # noqa: PLC0415 - only where Redis is set

                self.client = Redis.from_url(settings.REDIS_URL, socket_timeout=2)
            pipe = self.client.pipeline(transaction=False)
            for (ref, what, period_name), amount in pushing.items():
                name = redis_name(ref, period_name)
                pipe.hincrbyfloat(name, what, amount)
                pipe.expire(name, TTL_S["day" if len(period_name) > 7 else "month"])
            reads = [(o.ref, period_id(p, now)) for o in owners for p in PERIODS]
            for ref, period_name in reads:
                pipe.hgetall(redis_name(ref, period_name))
            answers = pipe.execute()[2 * len(pushing) :]
        except with_redis_errors(OSError) as exc:
            log.warning("budget counters not synced with Redis: %s", exc)
            self.client = None
            return
        totals = {
            (ref, field.decode(), period_name): float(value)
            for (ref, period_name), found in zip(reads, answers, strict=True)
            for field, value in found.items()
        }
        self.budgets.settle(totals, pushing)


def table_totals(owners: list[Owner]) -> dict[Tally, float]:
    """Each owner's tokens, GPU-seconds and requests this day and month, from the table."""
    now = datetime.now(UTC)
    day, month = start_of("day", now), start_of("month", now)
    names = {p: period_id(p, now) for p in PERIODS}
    loads = settings.MSHIP_USAGE_BUDGET_LOADS  # GPU-second budgets count starts and wakes
    totals: dict[Tally, float] = {}
    for kind, column in (("key", "key_id"), ("team", "team_id")):
        refs = {o.id: o.ref for o in owners if o.kind == kind}
        if not refs:
            continue
        sums: dict[str, Any] = {}
        for period, since in (("day", day), ("month", month)):
            within = Q(minute__gte=since)
            sums[f"tokens_{period}"] = Sum(F("tokens_in") + F("tokens_out"), filter=within)
            gpu = F("gpu_seconds") + F("load_gpu_seconds") if loads else F("gpu_seconds")
            sums[f"gpu_seconds_{period}"] = Sum(gpu, filter=within)
            sums[f"requests_{period}"] = Sum("requests", filter=within)
        rows = (
            UsageMinute.objects.filter(**{f"{column}__in": list(refs), "minute__gte": month})
            .values(column)
            .annotate(**sums)
        )
        for row in rows:
            for what in ("tokens", "gpu_seconds", "requests"):
                for period in PERIODS:
                    value = row[f"{what}_{period}"]
                    if value:
                        totals[(refs[row[column]], what, names[period])] = float(value)
    return totals


sync = CounterSync(budgets, ledger)
