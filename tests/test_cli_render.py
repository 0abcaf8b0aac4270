"""What `modelship ps` and `describe` print of a deployment that waits for its start: its
place in the memory queue and the estimate, from the API's ondemand field."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from modelship_cli import render

ROW: dict[str, Any] = {
    "name": "chat",
    "state": "stopped",
    "state_label": "queued · waiting for memory",
    "state_changed_at": "2026-12-05T10:00:00Z",
    "effective_mode": "on_demand",
    "loader": "vllm",
    "model": "org/chat",
    "need_gib": 40,
    "idle_timeout_s": 600,
    "ondemand": {
        "inflight": 0,
        "queued": 3,
        "last_request_at": None,
        "phase": "queued",
        "position": 2,
        "eta_s": 95,
    },
}


def test_it_prints_the_estimate_beside_the_state_and_the_place_in_describe() -> None:
    row = render.ps_row(ROW, datetime(2026, 12, 5, 10, 1, tzinfo=UTC))
    assert row[1] == "queued · waiting for memory · ready in ~95s"
    assert render.record(ROW)["queue_place"] == 2  # ps --json
    said = render.on_demand_text(ROW["ondemand"])
    assert said.startswith("0 in flight, 3 queued, place 2 in the memory queue, ready in about")


def test_it_prints_no_estimate_where_nothing_waits() -> None:
    idle = {**ROW, "ondemand": {**ROW["ondemand"], "position": None, "eta_s": None}}
    assert render.ps_row(idle)[1] == "queued · waiting for memory"
