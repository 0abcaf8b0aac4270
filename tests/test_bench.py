"""Each benchmark once at a tiny size (bench/run_all.py --smoke): it completes with no
errors and the gateway's counters back at zero (each script exits 1 otherwise). A guard
against a benchmark that rotted, not a timed test: nothing here reads a time."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.heavy  # minutes of servers and engines: once per make test


def test_it_runs_every_benchmark_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "smoke.md"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run_all.py"), "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr + out.read_text()
    report = out.read_text()
    scripts = (
        "gateway",
        "cold_start",
        "cold_burst",
        "soak",
        "responses_socket",
        "litellm",
        "body_scans",
        "usage_cost",
        "prefix_routing",
        "flame",
        "route_table_checks",
        "scheduler_hop",
        "scheduler_site",
    )
    for script in (*scripts, "fleet"):
        assert f"bench/{script}" in report
    assert report.count("(exit 0,") == 16
    assert "gateway/modelship-w2" in report  # `serve --workers 2`
    assert "GPU memory in use" in report  # the fleet's figures
    assert "| cache-aware |" in report  # the routing policies' figures
    assert "| whose code (own samples) |" in report  # the gateway beside the yardstick
    assert "kept " in report and "new connection each check" in report  # the route table
    assert "added p50 by the hop" in report  # the site scheduler's hop
