"""What the command line prints: `ps` rows (like `ollama ps`) and deploy progress."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.table import Table

COLUMNS = ("NAME", "STATE", "MODE", "GPUS", "MEMORY", "IN FLIGHT", "QUEUED", "IDLE UNTIL")


def gpus_of(row: dict[str, Any]) -> str:
    placed = row.get("gpus") or []
    if not placed:
        return "-"
    return " ".join(",".join(str(i) for i in replica) for replica in placed)


def idle_until(row: dict[str, Any], now: datetime) -> str:
    """When an idle on-demand deployment is put away: its last request plus its timeout."""
    ondemand = row.get("ondemand") or {}
    last = ondemand.get("last_request_at")
    if row.get("effective_mode") != "on_demand" or row.get("state") != "ready":
        return "-"
    if ondemand.get("inflight") or not last:
        return "busy" if ondemand.get("inflight") else "-"
    # Seconds since the epoch (or an ISO time).
    since = (
        float(last) if isinstance(last, int | float) else datetime.fromisoformat(last).timestamp()
    )
    due = since + float(row.get("idle_timeout_s") or 0)
    left = int(due - now.timestamp())
    return "now" if left <= 0 else f"in {left // 60}m{left % 60:02d}s"


def ps_row(row: dict[str, Any], now: datetime | None = None) -> tuple[str, ...]:
    ondemand = row.get("ondemand") or {}
    counts = ondemand if row.get("effective_mode") == "on_demand" else {}
    return (
        row["name"],
        row["state"],
        row.get("effective_mode", row.get("mode", "")).replace("_", " "),
        gpus_of(row),
        f"{float(row.get('need_gib') or 0):g} GiB",
        str(counts.get("inflight", "-")),
        str(counts.get("queued", "-")),
        idle_until(row, now or datetime.now(UTC)),
    )


def ps_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*ps_row(row))
    return table


def progress_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("NAME", "STATE", "PROGRESS"):
        table.add_column(column)
    for row in rows:
        reason = (row.get("state_reason") or "").split("\n", 1)[0]
        table.add_row(row["name"], row["state"], reason[:100])
    return table
