"""Who follows which engine log: at most one follower per (user, deployment, replica).

Following a log holds a thread (the runtimes' followers block: a file polled for growth, a
Docker log stream, Ray's REST API) and a queue. A page reloaded fifty times, or a script
that reconnects in a loop, must not leave fifty threads reading the same log: a new follow
of the same replica by the same user ends the one before it, which closes its stream with
an `end` event saying so. One registry per process (each gateway worker has its own).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Final

REPLACED: Final = "replaced by a newer follow of this log"
GONE: Final = "the engine is gone"
QUEUE_LINES = 1000


@dataclass(eq=False)
class Follower:
    """One follow under way: the loop its stream runs in, its lines, and the event that
    tells its pump thread (and the runtime's follower) to stop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[str | tuple[str]] = field(
        default_factory=lambda: asyncio.Queue(maxsize=QUEUE_LINES)
    )
    leaving: threading.Event = field(default_factory=threading.Event)

    def end(self, why: str) -> None:
        """Stop following, from any thread: the pump stops, the stream ends saying `why`."""
        self.leaving.set()
        self.loop.call_soon_threadsafe(self._ended, why)

    def _ended(self, why: str) -> None:
        self.drain()
        self.queue.put_nowait((why,))

    def drain(self) -> None:
        """Empty the queue (in its loop): a pump blocked on a full queue gets its room, sees
        `leaving` and stops, instead of waiting for a reader that has gone."""
        while not self.queue.empty():
            self.queue.get_nowait()


_lock = threading.Lock()
_current: dict[tuple[int, int, int], Follower] = {}


def take(key: tuple[int, int, int], follower: Follower) -> None:
    """`follower` is now the one following `key` (user, deployment, replica); the one
    before it, if any, ends."""
    with _lock:
        before, _current[key] = _current.get(key), follower
    if before is not None:
        before.end(REPLACED)


def release(key: tuple[int, int, int], follower: Follower) -> None:
    """`follower` stopped: it no longer holds `key` (unless a newer one does already)."""
    with _lock:
        if _current.get(key) is follower:
            del _current[key]


def following() -> int:
    with _lock:
        return len(_current)


def backlog() -> int:
    """Lines waiting in every follower's queue: a reader that does not keep up shows here."""
    with _lock:
        return sum(f.queue.qsize() for f in _current.values())
