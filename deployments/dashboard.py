"""What the admin's landing page shows beside the deployments and their memory: the last
failures with their whole reason, and the host's own memory (where CPU engines run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployments import display
from deployments.models import DeploymentEvent, State

GIB = 2**30
FAILURES = 5
# Events that say a deployment did not come up: its start failed, or it did not fit.
FAILURE_KINDS = (State.FAILED, "start_refused")
MEMINFO = Path("/proc/meminfo")


def last_failures(count: int = FAILURES) -> list[dict[str, Any]]:
    events = DeploymentEvent.objects.filter(kind__in=FAILURE_KINDS).order_by("-time", "-id")
    return [
        {
            "id": event.deployment_id,
            "name": event.deployment_name,
            "kind": "start refused" if event.kind == "start_refused" else "failed",
            "at": event.time.timestamp(),
            "when": display.moment(event.time),
            "reason": event.text[: display.REASON_CHARS],
        }
        for event in events[:count]
    ]


def host_memory(meminfo: Path = MEMINFO) -> dict[str, float] | None:
    """The host's RAM, total and in use (what is not available to new work), in GiB; None
    where the kernel does not tell (not Linux)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * 1024  # kB
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        return None
    total, available = fields["MemTotal"], fields["MemAvailable"]
    # To a tenth: the live pages are sent the host panel when it changes, not at every page.
    return {
        "total_gib": round(total / GIB, 1),
        "used_gib": round((total - available) / GIB, 1),
    }
