"""One timer per event loop, instead of one timer or task per request.

Deadlines that rarely fire (a request body that stalls, request headers that never end) and
watches that rarely matter (a caller who hangs up during a short answer) were set up and
torn down per request: timers moved and cancelled, a task made and cancelled. With hundreds
of requests in flight that was a measurable share of the gateway's CPU (bench/README.md).
Here each kind keeps its items in a set that one timer looks over every `interval` seconds,
while the set is not empty; an item's `sweep(now)` says whether it is done with.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable


class Item(Protocol):
    def sweep(self, now: float) -> bool:
        """Act if due; True to be dropped from the sweep."""
        ...


class Sweep:
    _of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Sweep]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: Callable[[], float]) -> None:
        self.loop = loop
        self.interval = interval
        self.items: set[Item] = set()
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop, kind: str, interval: Callable[[], float]) -> Sweep:
        kinds = cls._of.get(loop)
        if kinds is None:
            kinds = cls._of[loop] = {}
        sweep = kinds.get(kind)
        if sweep is None:
            sweep = kinds[kind] = cls(loop, interval)
        return sweep

    def add(self, item: Item) -> None:
        self.items.add(item)
        if self.timer is None:
            self.timer = self.loop.call_later(self.interval(), self._run)

    def discard(self, item: Item) -> None:
        self.items.discard(item)

    def _run(self) -> None:
        self.timer = None
        now = self.loop.time()
        for item in list(self.items):
            if item.sweep(now):
                self.items.discard(item)
        if self.items:
            self.timer = self.loop.call_later(self.interval(), self._run)


def quarter(timeout: float) -> float:
    """A sweep's interval for a deadline: it fires between 1 and 1.25 deadlines late (at
    most a second more)."""
    return min(1.0, max(0.02, timeout / 4))
