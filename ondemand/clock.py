"""Time for the controller: a Clock is injected, the system's or a test's (which moves only
when told), so that every timer of the on-demand rules runs on it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    # The wait is the clock's own (not asyncio.timeout) so that a test's clock decides it.
    async def wait(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
        """Until the event is set (True) or the timeout passes (False)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
        # asyncio.timeout, not wait_for (a task per wait, and every waiting request of a
        # burst waits again at each change).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0)):
                await event.wait()
            return True
        return False
