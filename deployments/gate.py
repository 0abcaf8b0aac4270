"""The start-up gate: one engine start at a time on this host, across processes.

Starts run in django-q workers, the ASGI server and management commands; a file lock is the
one primitive all of them share on a host, and the kernel drops it when a holder dies.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextmanager
def start_gate() -> Iterator[None]:
    run_dir = Path(settings.MSHIP_RUN_DIR)
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
