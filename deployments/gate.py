"""The start-up gate: one engine start at a time, across processes and hosts.

Starts run in django-q workers, the ASGI server and management commands; a file lock is the
one primitive all of them share on a host, and the kernel drops it when a holder dies. A
site on PostgreSQL may have several hosts (gateway hosts start on-demand models too), so
there the gate is also a PostgreSQL advisory lock, which the server drops when the holder's
connection goes. The file lock comes first: a host's own starts queue on it, not on the
database.
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

# The advisory lock's key: any constant the site's other locks do not use ("mship" + 1).
ADVISORY_KEY = 0x6D73_6869_7001


@contextmanager
def start_gate() -> Iterator[None]:
    run_dir = Path(settings.MSHIP_RUN_DIR)
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with site_lock():
                yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def site_lock() -> Iterator[None]:
    """The advisory lock on PostgreSQL (held by this thread's connection), nothing else."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_KEY])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])
