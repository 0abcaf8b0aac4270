"""Reads and lease writes of one deployment that many requests ask for at once share one
query. A burst of first requests to a stopped model would otherwise read its row a few times
each, and write its lease once each, every query on a connection of its own.

A caller joins a call only while that call is still waiting for its thread, so the row it
gets was read after it asked: coalescing never serves a stale view."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from asgiref.sync import sync_to_async

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


@dataclass
class _Call(Generic[T]):
    future: asyncio.Future[T]
    arg: float  # the largest any joined caller asked for


@dataclass
class Coalesced(Generic[T]):
    """`await coalesced(key, arg)`: fn(key, arg) in a worker thread, shared by the callers
    with the same key that asked before it began; `arg` is the largest they asked for."""

    fn: Callable[[int, float], T]
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiting: dict[int, _Call[T]] = field(default_factory=dict)
    running: set[asyncio.Task[None]] = field(default_factory=set)

    async def __call__(self, key: int, arg: float = 0.0) -> T:
        with self.lock:
            call = self.waiting.get(key)
            if call is None:
                call = _Call(asyncio.get_running_loop().create_future(), arg)
                self.waiting[key] = call
                task = asyncio.ensure_future(self._run(key, call))
                self.running.add(task)  # a task nobody awaits is kept until it ends
                task.add_done_callback(self.running.discard)
            else:
                call.arg = max(call.arg, arg)
        # One caller leaving (a client hung up) does not cancel the others' call.
        return await asyncio.shield(call.future)

    async def _run(self, key: int, call: _Call[T]) -> None:
        def begin() -> T:
            with self.lock:  # from here on, a new caller makes a new call
                if self.waiting.get(key) is call:
                    del self.waiting[key]
                arg = call.arg
            return self.fn(key, arg)

        try:
            result = await sync_to_async(begin, thread_sensitive=False)()
        except Exception as exc:
            call.future.set_exception(exc)
            # Seen here too: every caller may have left.
            call.future.add_done_callback(lambda f: f.exception())
        else:
            call.future.set_result(result)
