"""A clock that moves only when a test says so, for the on-demand controller's timers."""

from __future__ import annotations

import asyncio
from typing import Any


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.sleepers: list[tuple[float, asyncio.Future[Any]]] = []

    def now(self) -> float:
        return self.t

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
        if event.is_set():
            return True
        timer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.t + max(timeout, 0), timer))
        woken: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        try:
            done, _ = await asyncio.wait({timer, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            timer.cancel()
        return woken in done and not woken.cancelled()

    async def advance(self, seconds: float) -> None:
        self.t += seconds
        for at, timer in list(self.sleepers):
            if at <= self.t and not timer.done():
                timer.set_result(None)
        self.sleepers = [(at, f) for at, f in self.sleepers if not f.done()]
        await settle()


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)
