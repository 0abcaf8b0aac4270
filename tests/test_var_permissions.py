"""The state folder and the SQLite database are the owner's only: `manage.py migrate` (and
`serve`, through the same function) makes them so at start and warns when they were looser."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from typing import TYPE_CHECKING

from common.var_dir import secure
from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def migrate(var: Path) -> subprocess.CompletedProcess[str]:
    """The real command, on the embedded default: SQLite in var/ (no DATABASE_URL)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(MSHIP_VAR_DIR=str(var), PROMETHEUS_MULTIPROC_DIR=str(var.parent / "metrics"))
    return subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )


def test_it_makes_a_new_var_folder_and_database_readable_by_the_owner_only(tmp_path: Path) -> None:
    var = tmp_path / "var"
    done = migrate(var)
    assert "warning" not in done.stderr, done.stderr
    database = var / "modelship.sqlite3"
    assert mode(var) == 0o700
    assert mode(database) == 0o600
    with sqlite3.connect(database) as db:  # WAL mode, as the site opens it
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)")
        assert mode(var / "modelship.sqlite3-wal") == 0o600
        assert mode(var / "modelship.sqlite3-shm") == 0o600


def test_it_tightens_a_looser_var_folder_and_database_and_says_so(tmp_path: Path) -> None:
    var = tmp_path / "var"
    migrate(var)
    database = var / "modelship.sqlite3"
    wal = var / "modelship.sqlite3-wal"
    # An open connection keeps the WAL in place for the restart to find, as a running site does.
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)")
        var.chmod(0o755)
        database.chmod(0o644)
        wal.chmod(0o664)
        done = migrate(var)
        assert mode(var) == 0o700
        assert mode(database) == 0o600
        assert mode(wal) == 0o600
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3, done.stderr
    assert f"{var} was readable or writable by others (mode 755); it is now 700" in warnings[0]
    assert "mode 644" in warnings[1] and "mode 664" in warnings[2]
    assert "warning" not in migrate(var).stderr  # quiet once tight


def test_it_leaves_a_planted_link_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("not ours")
    outside.chmod(0o644)
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    (var / "db.sqlite3-wal").symlink_to(outside)
    warnings = secure(var, var / "db.sqlite3")
    assert mode(outside) == 0o644
    assert warnings == [
        f"{var / 'db.sqlite3-wal'} is a symbolic link; its permissions were left as they are"
    ]
