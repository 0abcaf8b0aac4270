"""A pull while it runs: where it writes, how far it is, whether it should stop.

A reporter thread writes the progress to the pull's row twice a second (bytes, rate, the
heartbeat the sweep reads to find a pull whose worker died) and notices when the row is
deleted, which cancels the pull at its next chunk.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from deployments.store.models import StoredModel

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)
REPORT_S = 0.5
DISK_CHECK_BYTES = 16 << 20
GIB = 2**30


class PullFailed(Exception):
    """A pull that cannot finish; its message is the operator's. `keep` leaves what it
    fetched for the next try to resume from."""

    def __init__(self, message: str, keep: bool = True) -> None:
        super().__init__(message)
        self.keep = keep


class PullCancelled(PullFailed):
    def __init__(self) -> None:
        super().__init__("the stored model was deleted while it was pulled", keep=False)


class Job:
    def __init__(self, pk: int, staging: Path, may_reach_host: bool = False) -> None:
        self.pk = pk
        self.staging = staging
        self.may_reach_host = may_reach_host
        self.cancelled = threading.Event()
        self.finished = threading.Event()
        self.total: int | None = None
        self.counted = 0  # bytes a fetcher counted itself
        self.watch: Path | None = None  # else the size of this folder is the progress
        self.checksums = 0
        self.rate = 0.0
        self.stopped: PullFailed | None = None  # why the reporter stopped the pull
        self.next_disk_check = 0
        self.reporter = threading.Thread(target=self.report, name=f"pull-{pk}", daemon=True)

    # what fetchers call

    def expect(self, total: int, already: int = 0) -> None:
        """The pull's size, known: refused at once where the store's disk cannot hold what
        is left to fetch and keep MSHIP_MODEL_STORE_MIN_FREE_GIB free."""
        self.total = total
        self.staging.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.staging).free
        reserve = int(settings.MSHIP_MODEL_STORE_MIN_FREE_GIB * GIB)
        needed = max(0, total - already)
        if needed > free - reserve:
            raise PullFailed(
                f"the store's disk has {free / GIB:.2f} GiB free; this model needs"
                f" {needed / GIB:.2f} GiB more and {reserve / GIB:.2f} GiB are kept free"
                " (MSHIP_MODEL_STORE_MIN_FREE_GIB)",
                keep=False,
            )

    def advance(self, count: int) -> None:
        self.counted += count
        if self.counted >= self.next_disk_check:  # a size no header stated: the disk decides
            self.next_disk_check = self.counted + DISK_CHECK_BYTES
            self.check_disk()
        self.check()

    def check(self) -> None:
        if self.stopped is not None:
            raise self.stopped
        if self.cancelled.is_set():
            raise PullCancelled

    def check_disk(self) -> None:
        """Stops the pull where the store's disk is down to MSHIP_MODEL_STORE_MIN_FREE_GIB."""
        reserve = settings.MSHIP_MODEL_STORE_MIN_FREE_GIB * GIB
        free = shutil.disk_usage(self.staging).free
        if free < reserve:
            self.stopped = PullFailed(
                f"the store's disk is down to {free / GIB:.2f} GiB free, under the"
                f" {reserve / GIB:.2f} GiB kept free (MSHIP_MODEL_STORE_MIN_FREE_GIB):"
                " nothing was kept",
                keep=False,
            )
            self.cancelled.set()

    def verified(self, files: int = 1) -> None:
        self.checksums += files

    # the reporter

    @property
    def done(self) -> int:
        if self.watch is None:
            return self.counted
        return folder_size(self.watch)

    def report(self) -> None:
        last, when = 0, time.monotonic()
        try:
            while not self.finished.wait(REPORT_S):
                done, now = self.done, time.monotonic()
                instant = (done - last) / max(now - when, 1e-3)
                self.rate = instant if not self.rate else 0.7 * self.rate + 0.3 * instant
                last, when = done, now
                self.save(done)
                if self.watch is not None and self.staging.exists():
                    self.check_disk()
        finally:
            close_old_connections()

    def save(self, done: int) -> None:
        updated = StoredModel.objects.filter(pk=self.pk).update(
            bytes_done=done,
            bytes_total=self.total,
            rate_bps=self.rate,
            checksums=self.checksums,
            heartbeat_at=timezone.now(),
        )
        if not updated:
            self.cancelled.set()

    def __enter__(self) -> Job:
        self.reporter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finished.set()
        self.reporter.join()


def folder_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue  # renamed or removed as it was counted
    return total


def disk_full(exc: BaseException) -> bool:
    """Whether a failure is the disk being full, however deep a library wrapped it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
