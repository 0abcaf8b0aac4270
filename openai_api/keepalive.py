"""SSE keepalives while Modelship itself makes a streaming request wait: for a slot, that is
for a cold start or for memory in the queue.

They commit the answer to 200 and SSE, so they stop the moment the request has its slot:
once the engine is called, its status and headers pass through unchanged (an engine's 500
reaches the client as a 500), unless Modelship had already opened the stream while it
waited, in which case what follows comes inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings

from common import tracing
from openai_api import wait_status
from openai_api.forwarder import sse_start

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager, AsyncExitStack

    from openai_api.forwarder import Send

T = TypeVar("T")
COMMENT = b": keepalive\n\n"
CHANGE_CHECK_S = 1.0  # how soon a changed place or step is said
# The answer a Responses turn keeps alive while it waits for its slot: set by the foreground
# handler of a streaming request (engine_turn reads it); None elsewhere (background runs).
waiting_answer: ContextVar[SseOpener | None] = ContextVar("waiting_answer", default=None)


class SseOpener:
    """One streaming request's answer: its SSE headers go out once, before any body, from
    whichever of the keepalives and the queued notice writes first."""

    def __init__(self, send: Send, request_id: str) -> None:
        self.send = send
        self.request_id = request_id
        self.committed = False
        self._lock = asyncio.Lock()

    async def write(self, body: bytes) -> None:
        async with self._lock:
            if not self.committed:
                await self.send(sse_start(self.request_id))
                self.committed = True
            await self.send({"type": "http.response.body", "body": body, "more_body": True})


async def enter_kept_alive(
    held: AsyncExitStack, slot: AbstractAsyncContextManager[T], opener: SseOpener | None
) -> T:
    """Enter the slot into `held` with keepalives while it is being acquired (a cold start,
    the queue), and none once it is: the caller then calls the engine. A slot that never
    waits (`immediate`, an always-on replica) is entered without them."""
    with tracing.span("modelship.slot"):  # the wait for an engine: a queue, a start
        if opener is None or getattr(slot, "immediate", False):
            return await held.enter_async_context(slot)
        async with kept_alive(opener):
            return await held.enter_async_context(slot)


@contextlib.asynccontextmanager
async def kept_alive(opener: SseOpener | None) -> AsyncIterator[None]:
    """A comment every MSHIP_SSE_KEEPALIVE_S while the block runs (nothing without an
    opener: a request that does not stream), with the wait's figures once whoever makes it
    wait gives them (openai_api/wait_status.py): said again as soon as what it waits for, its
    place or its start's step changes. The beat ends between two writes, never in the middle
    of one."""
    if opener is None:
        yield
        return
    done = asyncio.Event()
    status = wait_status.WaitStatus()
    token = wait_status.current.set(status)

    async def beat() -> None:
        interval = settings.MSHIP_SSE_KEEPALIVE_S
        said: tuple[Any, ...] | None = None
        last_write = time.monotonic()
        while not done.is_set():
            # asyncio.timeout, not wait_for: wait_for makes a task of the wait, each beat of
            # each waiting stream (a burst of first requests has a thousand).
            step = min(interval, CHANGE_CHECK_S) if status.source is not None else interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(step):
                    await done.wait()
                return
            figures = status.figures()
            now = time.monotonic()
            changed = figures is not None and said != (said := wait_status.key_of(figures))
            if changed or now - last_write >= interval:
                last_write = now
                await opener.write(COMMENT if figures is None else wait_status.comment(figures))

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        done.set()
        wait_status.current.reset(token)
        # A beat whose write failed found the caller gone: the request's own path finds
        # that out too.
        with contextlib.suppress(Exception):
            await asyncio.shield(beating)
