"""Time for the controller: the real clock, or a test's, which moves only when told."""

from __future__ import annotations

import asyncio
import contextlib
import time


class Clock:
    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Until the event is set (True) or the timeout passes (False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(timeout, 0))
            return True
        return False
