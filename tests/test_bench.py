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

pytestmark = pytest.mark.heavy  # a minute of servers and engines on both cores: once per make test


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
    # Every script, in RUNS' order: run_all runs several at once, and its report keeps that
    # order whichever finishes first.
    scripts = (
        "fleet",
        "scheduler",
        "scheduler_site",
        "gateway",
        "flame",
        "usage_cost",
        "route_table_checks",
        "scheduler_hop",
        "prefix_routing",
        "cold_start",
        "cold_burst",
        "soak",
        "responses_socket",
        "body_scans",
        "litellm_anchor",
    )
    places = [report.find(f"`bench/{script}.py ") for script in scripts]
    assert -1 not in places, dict(zip(scripts, places, strict=True))
    assert places == sorted(places), dict(zip(scripts, places, strict=True))
    assert report.count("(exit 0,") == 17  # cold_start twice: the simulated engine, the tiny GGUF
    assert "gateway/modelship-w2" in report  # `serve --workers 2`
    assert "GPU memory in use" in report  # the fleet's figures
    assert "| cache-aware |" in report  # the routing policies' figures
    assert "| whose code (own samples) |" in report  # the gateway beside the yardstick
    assert "kept " in report and "new connection each check" in report  # the route table
    assert "added p50 by the hop" in report  # the site scheduler's hop
