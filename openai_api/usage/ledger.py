"""Usage added up in memory per minute, written to the usage table in batches.

A request's end adds its figures to its (minute, key, team, deployment) row in a dict, under
a lock held for a few additions; a thread of its own swaps the dict out every
MSHIP_USAGE_FLUSH_S and adds it to the table in one statement (an upsert that adds to the
row other processes and earlier flushes wrote). A write that fails keeps its rows for the
next try, so a database outage loses nothing while the process lives; a clean stop writes
what is left (`close`), a crash loses at most one flush interval.
"""

from __future__ import annotations

import atexit
import logging
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from openai_api.usage.models import COUNTED, UsageMinute

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

Row = tuple[int, int, int, str]  # minute (epoch seconds), key id, team id, deployment
WIDTH = len(COUNTED)
T = TypeVar("T")


def upsert_sql() -> str:
    table = connection.ops.quote_name(UsageMinute._meta.db_table)
    columns = ["minute", "key_id", "team_id", "deployment", *COUNTED]
    quoted = [connection.ops.quote_name(c) for c in columns]
    added = ", ".join(f"{q} = {table}.{q} + excluded.{q}" for q in quoted[4:])
    return (
        f"INSERT INTO {table} ({', '.join(quoted)}) VALUES ({', '.join(['%s'] * len(columns))})"
        f" ON CONFLICT ({', '.join(quoted[:4])}) DO UPDATE SET {added}"
    )


def write(rows: dict[Row, list[float]]) -> None:
    """Add `rows` to the table (one statement, every row in it or none)."""
    adapt = connection.ops.adapt_datetimefield_value
    params = [
        (adapt(datetime.fromtimestamp(minute, UTC)), key_id, team_id, deployment, *values)
        for (minute, key_id, team_id, deployment), values in rows.items()
    ]
    # One transaction: a write that breaks half-way adds nothing, so its retry adds all once.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(upsert_sql(), params)


class Ledger:
    def __init__(self, writer: Callable[[dict[Row, list[float]]], None] = write) -> None:
        self.writer = writer
        self.rows: dict[Row, list[float]] = {}
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        # What a write that failed kept, for the next one (apart: `on_swap` has seen it).
        self.retry: dict[Row, list[float]] = {}
        # Told of each row once, as a flush takes it out of memory (the token and GPU-second
        # metrics, counted then rather than per request).
        self.on_swap: list[Callable[[dict[Row, list[float]]], None]] = []
        # Told after each write that succeeded, with what it wrote (budgets read their totals
        # again then, where no Redis keeps them).
        self.after_write: list[Callable[[dict[Row, list[float]]], None]] = []

    def row(self, row: Row) -> list[float]:
        """The figures of `row` to add to in place; the caller holds `lock` (and started the
        thread)."""
        kept = self.rows.get(row)
        if kept is None:
            kept = self.rows[row] = [0.0] * WIDTH
        return kept

    def add(self, row: Row, values: Iterable[float]) -> None:
        if self.thread is None:
            self.start()
        with self.lock:
            kept = self.rows.get(row)
            if kept is None:
                self.rows[row] = list(values)
            else:
                for index, value in enumerate(values):
                    kept[index] += value

    def read_with_unwritten(
        self, read: Callable[[], T], wanted: Callable[[Row], bool]
    ) -> tuple[T, dict[Row, list[float]]]:
        """`read()` (of the table) and the rows `wanted` picks of what is not written yet, as
        one view: no flush runs between the two, so nothing is counted in both or missed
        (one process's figures are exact; another's show once it flushed)."""
        with self.flush_lock:
            found = read()
            with self.lock:
                pending: dict[Row, list[float]] = {}
                for row, values in (*self.retry.items(), *self.rows.items()):
                    if wanted(row):
                        kept = pending.setdefault(row, [0.0] * WIDTH)
                        for index, value in enumerate(values):
                            kept[index] += value
        return found, pending

    def start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, name="modelship-usage", daemon=True)
                self.thread.start()
                atexit.register(self.close)

    def run(self) -> None:
        while not self.stop.wait(settings.MSHIP_USAGE_FLUSH_S):
            try:
                self.flush()
            finally:
                connection.close()  # this thread holds no connection between flushes

    def flush(self) -> bool:
        """Write what was added since the last flush, with what a failed write kept; False
        (all of it kept for the next) when this one fails too."""
        with self.flush_lock:
            with self.lock:
                fresh, self.rows = self.rows, {}
            for listener in list(self.on_swap):
                self.tell(listener, fresh)
            rows, self.retry = self.retry, {}
            for row, values in fresh.items():
                kept = rows.get(row)
                if kept is None:
                    rows[row] = values
                else:
                    rows[row] = [a + b for a, b in zip(kept, values, strict=True)]
            if not rows:
                return True
            try:
                self.writer(rows)
            except DatabaseError as exc:
                log.warning("usage of %d row(s) kept for the next flush: %s", len(rows), exc)
                self.retry = rows
                return False
            for listener in list(self.after_write):
                self.tell(listener, rows)
            return True

    @staticmethod
    def tell(
        listener: Callable[[dict[Row, list[float]]], None], rows: dict[Row, list[float]]
    ) -> None:
        try:
            listener(rows)
        except Exception:
            log.exception("a listener of the usage flush failed")

    def close(self) -> None:
        """The process stops: what is left is written now."""
        self.stop.set()
        self.flush()


ledger = Ledger()
