"""A start attempt, shared by the requests that wait for it: begun under the controller's lock
until its memory is claimed, its engine's health awaited outside it, and each waiter's look
at how it ended (the controller's `_attempt` and `_look`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ondemand.clock import Clock
    from ondemand.policy import StartOutcome
    from ondemand.state import Deployer

POLL_S = 15.0  # a waiter looks again at least this often


async def claimed(deployer: Deployer, deployment_id: int) -> asyncio.Future[None]:
    """Begin the deployment's start; return once it has claimed its memory (marked starting,
    under the start-up gate), with the rest of the start (the engine's health wait) still
    running. Raises what the start raised before its claim (InsufficientMemory)."""
    loop = asyncio.get_running_loop()
    marked = asyncio.Event()

    def claim_made() -> None:
        loop.call_soon_threadsafe(marked.set)

    start = asyncio.ensure_future(deployer.restart(deployment_id, claim_made))
    seen = asyncio.ensure_future(marked.wait())
    try:
        await asyncio.wait({start, seen}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        seen.cancel()
    if start.done():
        start.result()
    return start


async def outcome(
    clock: Clock, attempt: asyncio.Task[StartOutcome], changed: asyncio.Event, within_s: float
) -> StartOutcome | None:
    """The attempt's outcome once it ends; None when a change or the poll interval came
    first. The attempt is shielded: a waiter that gives up never cancels it half-way."""
    if not attempt.done():
        finished: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(attempt))
        woke: asyncio.Future[Any] = asyncio.ensure_future(
            clock.wait(changed, min(POLL_S, within_s))
        )
        try:
            await asyncio.wait({finished, woke}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woke.cancel()
            if not finished.done():
                finished.cancel()
            elif not finished.cancelled():
                finished.exception()  # read below from the attempt; marked as seen here
        if not attempt.done():
            return None
    exc = attempt.exception()
    if exc is not None:
        raise exc
    return attempt.result()
