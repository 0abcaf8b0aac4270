"""One thread that runs the database reads handed to it from an event loop and keeps its
connection between them.

The route table asks whether its tables changed twice a second in every gateway process. Run
on a pool thread that closes its connection after each read, each check opened a new
connection: on PostgreSQL a backend forked (and authenticated, and logged where connections
are logged) twice a second per process, forever. This thread opens one and keeps it while
reads keep coming. It lets go of it after any error (a read that failed on a connection
the server dropped is read once more on a new one), once no read came for IDLE_S, once it is
MAX_AGE_S old (a database moved to another address, a primary demoted behind a proxy: the next
connection follows), and at `release()`: a connection left open would hold the database (a test
database cannot be dropped under it). Each gateway process so holds one connection of its
own (`serve --workers 16`: sixteen).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, connection

from common.db_calls import lost

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

IDLE_S = 5.0
"""A connection no read used for this long is closed (longer than any usual check interval:
MSHIP_ROUTE_REFRESH_S is 0.5 s)."""
MAX_AGE_S = 60.0
"""A connection is opened anew at the first read after it is this old."""

Job = tuple["Callable[[], Any]", asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class DatabaseThread:
    def __init__(self, name: str, idle_s: float = IDLE_S, max_age_s: float = MAX_AGE_S) -> None:
        self.name = name
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self._closed_at = time.monotonic()  # the connection in use is no older than this
        self._jobs: queue.SimpleQueue[Job | threading.Event] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def run(self, read: Callable[[], T]) -> T:
        """`read()` on this thread, its connection kept for the next."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._start()
        self._jobs.put((read, loop, future))
        return await future

    def release(self, wait_s: float = 5.0) -> None:
        """Close the connection now (the reads under way first); blocks up to `wait_s`."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                return
            if self._thread is threading.current_thread():  # a coroutine finalised here
                self._close()
                return
        closed = threading.Event()
        self._jobs.put(closed)
        closed.wait(wait_s)

    def _start(self) -> None:
        with self._lock:
            # Not alive: a thread of the process this one was forked from.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                self._close()
                continue
            if isinstance(job, threading.Event):
                self._close()
                job.set()
                continue
            read, loop, future = job
            if future.cancelled():  # its caller is gone (a client that hung up): not read
                continue
            if time.monotonic() - self._closed_at >= self.max_age_s:
                self._close()
            result, error = self._read(read)
            # A loop that closed meanwhile has no one waiting for the answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, future, result, error)
            if error is not None and not isinstance(error, Exception):
                raise error  # SystemExit and the like end the thread, its caller told

    def _read(self, read: Callable[[], Any]) -> tuple[Any, BaseException | None]:
        """`read()`, and once more on a new connection where the kept one failed because the
        server had dropped it (it stood idle through a restart): the caller never sees that.
        An error is handed to the caller, and the connection is not kept after it."""
        for last in (False, True):
            try:
                return read(), None
            except BaseException as exc:
                again = not last and isinstance(exc, DatabaseError) and lost()
                self._close()
                if not again:
                    return None, exc
        raise AssertionError("read twice")  # the second pass returns

    def _close(self) -> None:
        self._closed_at = time.monotonic()
        with contextlib.suppress(Exception):  # a connection already broken closes as far as it can
            connection.close()


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, (StopIteration, StopAsyncIteration)):  # a future refuses these
        future.set_exception(RuntimeError(repr(error)))
    else:
        future.set_exception(error)
