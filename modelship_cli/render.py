"""What the command line prints: `ps` rows (like `ollama ps`) and deploy progress."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

COLUMNS = (
    "NAME",
    "STATE",
    "SINCE",
    "MODE",
    "MODEL",
    "GPUS",
    "MEMORY",
    "IN FLIGHT",
    "QUEUED",
    "IDLE UNTIL",
)
# The states of a deployment whose engine runs (ps --running); `ps` leaves out only those
# with nothing to show (stopped, planned), like docker's, and -a shows every one.
RUNNING = ("starting", "ready", "asleep", "stopping")
QUIET = ("stopped", "planned")


def gpus_of(row: dict[str, Any]) -> str:
    placed = row.get("gpus") or []
    if not placed:
        return "-"
    return " ".join(",".join(str(i) for i in replica) for replica in placed)


def seconds_of(moment: Any) -> float | None:
    """A time the API gives (ISO, or seconds since the epoch) in seconds since the epoch."""
    if isinstance(moment, int | float):
        return float(moment)
    if isinstance(moment, str) and moment:
        return datetime.fromisoformat(moment).timestamp()
    return None


def idle_left_s(row: dict[str, Any], now: datetime) -> int | None:
    """Seconds until an idle on-demand deployment is put away (its last request plus its
    timeout); None where no countdown runs (busy, not ready, not on demand)."""
    ondemand = row.get("ondemand") or {}
    last = seconds_of(ondemand.get("last_request_at"))
    if row.get("effective_mode") != "on_demand" or row.get("state") != "ready":
        return None
    if ondemand.get("inflight") or last is None:
        return None
    return max(0, int(last + float(row.get("idle_timeout_s") or 0) - now.timestamp()))


def age(seconds: float | None) -> str:
    """A duration as `docker ps` says one, in its largest unit."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def record(row: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """One deployment for scripts (ps --json): machine keys, numbers without units."""
    now = now or datetime.now(UTC)
    ondemand = row.get("ondemand") or {}
    on_demand = row.get("effective_mode") == "on_demand"
    since = seconds_of(row.get("state_changed_at"))
    return {
        "name": row["name"],
        "state": row["state"],
        # The words the admin shows (the API's state_label; an older server sends none).
        "state_label": row.get("state_label") or row["state"],
        "state_since": row.get("state_changed_at"),
        "in_state_s": None if since is None else max(0, int(now.timestamp() - since)),
        "mode": row.get("effective_mode", row.get("mode")),
        "loader": row.get("loader"),
        "model": row.get("model"),
        "gpus": row.get("gpus") or [],
        "need_gib": float(row.get("need_gib") or 0),
        "in_flight": ondemand.get("inflight") if on_demand else None,
        "queued": ondemand.get("queued") if on_demand else None,
        "queue_place": ondemand.get("position") if on_demand else None,
        "ready_in_s": ondemand.get("eta_s") if on_demand else None,
        "idle_left_s": idle_left_s(row, now),
        "reason": row.get("state_reason") or "",
    }


def model_of(row: dict[str, Any]) -> str:
    """The loader and the model's last path part: what a column can hold."""
    model = str(row.get("model") or "").rstrip("/").rsplit("/", 1)[-1]
    return f"{row.get('loader')}: {model}" if model else str(row.get("loader"))


def ps_row(row: dict[str, Any], now: datetime | None = None) -> tuple[str, ...]:
    facts = record(row, now)
    left = facts["idle_left_s"]
    busy = facts["in_flight"] and facts["state"] == "ready"
    idle = "busy" if busy else "-" if left is None else f"in {left // 60}m{left % 60:02d}s"
    counts = ("-" if facts[k] is None else str(facts[k]) for k in ("in_flight", "queued"))
    state = facts["state_label"]
    if facts["ready_in_s"] is not None:
        state += f" · ready in ~{facts['ready_in_s']}s"
    return (
        row["name"],
        state,
        age(facts["in_state_s"]),
        str(facts["mode"] or "").replace("_", " "),
        model_of(row),
        gpus_of(row),
        f"{facts['need_gib']:g} GiB",
        *counts,
        "now" if left == 0 else idle,
    )


def ps_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in COLUMNS:
        table.add_column(column, no_wrap=column != "MODEL", overflow="fold")
    for row in rows:
        table.add_row(*ps_row(row))
    return table


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """Each failed deployment's reason, whole (its engine log's last lines included)."""
    return [
        f"{row['name']} failed: {row.get('state_reason') or 'no reason recorded'}"
        for row in rows
        if row["state"] == "failed"
    ]


def host_line(host: dict[str, Any]) -> str:
    """The memory the deployments hold of the budget, and each GPU's."""
    parts = [f"host: {host.get('held_gib', 0):g} of {host.get('capacity_gib', 0):g} GiB held"]
    ondemand = host.get("on_demand_capacity_gib")
    if ondemand is not None:
        parts.append(f"on demand may use {ondemand:g} GiB")
    for gpu in host.get("gpus") or []:
        parts.append(
            f"GPU {gpu['index']} ({gpu.get('name') or 'unnamed'}):"
            f" {gpu.get('held_gib', 0):g} of {gpu.get('total_gib', 0):g} GiB held"
        )
    return " · ".join(parts)


def progress_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("NAME", "STATE", "PROGRESS"):
        table.add_column(column)
    for row in rows:
        reason = (row.get("state_reason") or "").split("\n", 1)[0]
        table.add_row(row["name"], row["state"], reason[:100])
    return table


def to_the_second(moment: Any) -> str:
    """An ISO time the API gives, as a line prints it: date and time to the second."""
    return str(moment or "").split(".")[0].replace("T", " ").removesuffix("Z")


def event_line(event: dict[str, Any]) -> str:
    """One event as `modelship events` prints it: when (to the second), which, what, who."""
    when = to_the_second(event.get("time"))
    name = event.get("deployment_name") or "-"
    return f"{when}  {name}  {event.get('kind')}  [{event.get('actor')}]  {event.get('text')}"


# What `describe` shows of a deployment, in this order, under these labels.
DESCRIBED = (
    ("Name", "name"),
    ("Aliases", "aliases"),
    ("State", "state_label"),
    ("Since", "state_changed_at"),
    ("Mode", "effective_mode"),
    ("Mode switch waiting", "pending_mode"),
    ("Idle timeout (s)", "idle_timeout_s"),
    ("May be stopped to make room", "evictable"),
    ("Started when Modelship starts", "preload"),
    ("Priority", "priority"),
    ("Most requests at once", "max_concurrency"),
    ("Measured start (s)", "start_s"),
    ("Use case", "usecase"),
    ("Loader", "loader"),
    ("Model", "model"),
    ("Runtime", "runtime"),
    ("Image", "image"),
    ("Command", "command"),
    ("Memory (GiB)", "need_gib"),
    ("Memory estimate", "memory_estimate"),
    ("Memory learned (GiB)", "learned_gib"),
    ("Learned on", "learned_on"),
    ("Memory measured (GiB)", "measured_gib"),
    ("Memory kept asleep (GiB)", "asleep_gib"),
    ("GPUs per replica", "num_gpus"),
    ("GPUs held", "gpus"),
    ("Replicas", "num_replicas"),
    ("Engine URLs", "engine_urls"),
    ("Configuration", "config"),
    ("Running its configuration", "config_current"),
    ("Saved conversations", "saved_conversations"),
    ("On demand", "ondemand"),
    ("When idle", "when_idle"),
    ("LiteLLM", "litellm"),
    ("Created", "created"),
    ("Updated", "updated"),
)


def shown(value: Any) -> str:
    if value in (None, "", [], {}):
        return "-"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def moment(value: Any) -> str:
    """A time the API gives, to the second, in UTC."""
    seconds = seconds_of(value)
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def on_demand_text(ondemand: Any) -> str:
    if not isinstance(ondemand, dict):
        return "-"
    last = ondemand.get("last_request_at")
    waiting = ""
    if ondemand.get("position"):
        waiting += f", place {ondemand['position']} in the memory queue"
    if ondemand.get("eta_s") is not None:
        waiting += f", ready in about {ondemand['eta_s']} s"
    return (
        f"{ondemand.get('inflight', 0)} in flight, {ondemand.get('queued', 0)} queued{waiting},"
        f" last request {moment(last) if last else 'none'}"
    )


def words(value: Any) -> str:
    """A mode as the admin writes it: "on demand", not on_demand."""
    return shown(value).replace("_", " ")


def estimate_text(value: Any) -> str:
    """What the model's metadata says its engine holds, and the sequences its cache fits."""
    if not isinstance(value, dict):
        return "-"
    text = f"{value.get('gib', 0):g} GiB ({value.get('basis', '')})"
    if value.get("sequences_fit") is not None:
        text += f", {value['sequences_fit']} full-length sequences fit"
    if value.get("warning"):
        text += f": {value['warning']}"
    return text


def saved_text(value: Any) -> str:
    """A deployment's saved slot caches: how many, and their size on disk."""
    if not isinstance(value, dict):
        return "-"
    return f"{value.get('count', 0)} ({float(value.get('bytes', 0)) / 2**20:.1f} MiB)"


FORMATS = {
    "effective_mode": words,
    "pending_mode": words,
    "state_changed_at": moment,
    "created": moment,
    "updated": moment,
    "ondemand": on_demand_text,
    "saved_conversations": saved_text,
    "memory_estimate": estimate_text,
}


def description(row: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """Everything the change page shows, as `kubectl describe` would: a label per line, the
    failure's whole reason, then the deployment's latest events, oldest first."""
    width = max(len(label) for label, _ in DESCRIBED) + 1
    lines = [
        f"{label + ':':<{width}} {FORMATS.get(key, shown)(row.get(key))}"
        for label, key in DESCRIBED
    ]
    reason = row.get("state_reason") or ""
    lines.append("Reason:" if reason else f"{'Reason:':<{width}} -")
    lines.extend(f"  {line}" for line in reason.splitlines())
    lines.append("Events:" if events else f"{'Events:':<{width}} -")
    lines.extend(f"  {event_line(e)}" for e in reversed(events))
    return lines
