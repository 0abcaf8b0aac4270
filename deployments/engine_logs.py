"""Engine logs for operators: the tail of each replica, and one replica followed live."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from deployments import log_followers
from deployments.deployer import handles_of
from deployments.log_followers import GONE, Follower
from deployments.runtimes import EngineUnreachable, Handle, get_runtime
from deployments.runtimes.process import log_path

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from deployments.models import Deployment

MAX_TAIL = 10_000

log = logging.getLogger(__name__)


def log_handles(deployment: Deployment) -> list[Handle]:
    """The running engines' handles; for a process deployment that is not running, its log
    files, which outlive the engine (a container's log goes with the container)."""
    handles = handles_of(deployment)
    if handles or deployment.runtime != "process":
        return handles
    return [
        {"runtime": "process", "replica": i, "log": str(log_path(deployment.name, i))}
        for i in range(deployment.replica_count)
    ]


def tails(deployment: Deployment, lines: int) -> list[dict[str, Any]]:
    runtime = get_runtime(deployment.runtime)
    out = []
    for handle in log_handles(deployment):
        try:
            text = runtime.log_tail(handle, lines)
        except EngineUnreachable as exc:
            text = f"[{exc}]"
        out.append({"replica": handle.get("replica", 0), "lines": text.splitlines()})
    return out


async def follow(deployment: Deployment, replica: int, user_id: int = 0) -> AsyncIterator[bytes]:
    """Server-sent events, one per new log line, until the engine is gone, the client
    leaves, or the same user follows the same replica again (log_followers.py). The
    runtime's follower blocks, so it runs in a thread and hands lines over."""
    handles = [h for h in handles_of(deployment) if h.get("replica", 0) == replica]
    if not handles:
        yield b"event: end\ndata: the engine is not running\n\n"
        return
    runtime = get_runtime(deployment.runtime)
    loop = asyncio.get_running_loop()
    follower = Follower(loop)
    key = (user_id, deployment.pk, replica)

    def put(item: str | tuple[str]) -> None:
        # Waits while the queue is full (a slow reader); a reader that left drains it.
        asyncio.run_coroutine_threadsafe(follower.queue.put(item), loop).result()

    def pump() -> None:
        try:
            for line in runtime.follow_log(handles[0], follower.leaving):
                if follower.leaving.is_set():
                    return
                put(line)
        except Exception as exc:  # the daemon refused, or went: the stream says so, then ends
            if not follower.leaving.is_set():
                if not isinstance(exc, EngineUnreachable):
                    log.warning("following %s's log failed", deployment.name, exc_info=True)
                put(f"[{exc}]")
        finally:
            if not follower.leaving.is_set():
                put((GONE,))

    log_followers.take(key, follower)
    name = f"log-follow-{user_id}-{deployment.pk}-{replica}"
    threading.Thread(target=pump, name=name, daemon=True).start()
    try:
        # A comment first, so the client sees the stream open before any line.
        yield b": following\n\n"
        while isinstance(item := await follower.queue.get(), str):
            yield f"data: {item}\n\n".encode()
        yield f"event: end\ndata: {item[0]}\n\n".encode()
    finally:
        # The client left (or the stream ended): the pump stops at its next line or poll,
        # and one blocked on the full queue gets room to see that.
        follower.leaving.set()
        follower.drain()
        log_followers.release(key, follower)
