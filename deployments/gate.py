"""The start-up gate: one start's claim on memory at a time, across processes and hosts.

Starts run in django-q workers, the scheduler's owner and management commands; a file lock
is the one primitive all of them share on a host, and the kernel drops it when a holder
dies. A site on PostgreSQL may have several hosts (gateway hosts start on-demand models too),
so there the gate is also a PostgreSQL advisory lock, which the server drops when the
holder's connection goes. The file lock comes first: a host's own starts queue on it, not on
the database.

The gate covers a start's fit check and its claim (the row marked starting, with its GPUs),
not its engine's health wait: each start then holds `bringing_up` (a shared lock, file and
advisory, taken before the gate is let go) until its engine is ready or failed, so that
starts overlap while adoption (`no_start_under_way`: the gate and that lock exclusively)
still sees no start half-way.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

if TYPE_CHECKING:
    from collections.abc import Iterator

# The advisory locks' keys: any constants the site's other locks do not use ("mship" + 1, 2).
ADVISORY_KEY = 0x6D73_6869_7001
BRING_UP_KEY = 0x6D73_6869_7002
SLEEP_KEY = 0x6D73_6869_7003


@contextmanager
def start_gate() -> Iterator[None]:
    with _file_lock("start.lock", fcntl.LOCK_EX), site_lock():
        yield


@contextmanager
def site_lock(key: int = ADVISORY_KEY, shared: bool = False) -> Iterator[None]:
    """The advisory lock on PostgreSQL (held by this thread's connection), nothing else."""
    if connection.vendor != "postgresql":
        yield
        return
    kind = "_shared" if shared else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_advisory_lock{kind}(%s)", [key])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_unlock{kind}(%s)", [key])


@contextmanager
def sleep_gate() -> Iterator[None]:
    """One sleep's choice of its level at a time (the host memory level-1 sleepers keep),
    across processes and hosts, as the start gate is for starts' memory."""
    with _file_lock("sleep.lock", fcntl.LOCK_EX), site_lock(SLEEP_KEY):
        yield


@contextmanager
def bringing_up() -> Iterator[None]:
    """Held by a start from its claim until its engine is ready or failed (shared: any
    number of starts at once)."""
    with _file_lock("bring_up.lock", fcntl.LOCK_SH), site_lock(BRING_UP_KEY, shared=True):
        yield


@contextmanager
def no_start_under_way() -> Iterator[None]:
    """The gate, and no start between its claim and its engine's end (adoption's view)."""
    with start_gate(), _file_lock("bring_up.lock", fcntl.LOCK_EX), site_lock(BRING_UP_KEY):
        yield


@contextmanager
def _file_lock(name: str, mode: int) -> Iterator[None]:
    run_dir = Path(settings.MSHIP_RUN_DIR)
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / name).open("a") as lock:
        fcntl.flock(lock, mode)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
