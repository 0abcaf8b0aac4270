"""The start-up gate: one engine start at a time on a host (a file lock), and on PostgreSQL
across the site's hosts too (an advisory lock), dropped when its holder dies."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection

from deployments.gate import start_gate
from tests.conftest import REPO, env_for_subprocess

if TYPE_CHECKING:
    from pathlib import Path

# Another process takes the gate, says so, holds it until its stdin closes.
TAKER = """
import sys, django
django.setup()
from deployments.gate import start_gate
with start_gate():
    print("taken", flush=True)
    sys.stdin.read()
"""


class Taker:
    """Another process that takes the gate, and holds it until `release`."""

    def __init__(self, run_dir: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", TAKER],
            cwd=REPO,
            env=env_for_subprocess(MSHIP_RUN_DIR=str(run_dir)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.taken = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() == "taken":
            self.taken.set()

    def release(self) -> None:
        self.process.communicate("")


def test_it_lets_one_start_at_a_time_on_a_host(transactional_db: None, site: Any) -> None:
    with start_gate():
        other = Taker(site.MSHIP_RUN_DIR)
        assert not other.taken.wait(2)
    try:
        assert other.taken.wait(30)
    finally:
        other.release()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one host's gate on SQLite")
def test_it_lets_one_start_at_a_time_across_hosts_on_postgresql(
    transactional_db: None, site: Any, tmp_path: Path
) -> None:
    with start_gate():
        # Another host: its own run folder (file lock), the same database.
        elsewhere = Taker(tmp_path / "other-host")
        assert not elsewhere.taken.wait(2)
    assert elsewhere.taken.wait(30)
    # Its holder killed while holding it: the database drops the lock with its connection.
    elsewhere.process.kill()
    elsewhere.process.wait()
    again = Taker(tmp_path / "third-host")
    try:
        assert again.taken.wait(30)
    finally:
        again.release()
