"""django-q tasks of the on-demand controller."""

from __future__ import annotations

import time

from ondemand.reaper import reap_once

PASSES = 4
EVERY_S = 15.0


def reap() -> list[str]:
    """Scheduled every minute (django-q's finest), it reaps every 15 s within that minute."""
    stopped: list[str] = []
    for index in range(PASSES):
        began = time.monotonic()
        stopped += reap_once()
        if index < PASSES - 1:
            time.sleep(max(0.0, EVERY_S - (time.monotonic() - began)))
    return stopped
