"""Engine logs for operators: the tail of each replica, and one replica followed live."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from deployments.deployer import handles_of
from deployments.runtimes import EngineUnreachable, Handle, get_runtime
from deployments.runtimes.process import log_path

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from deployments.models import Deployment

MAX_TAIL = 10_000


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


async def follow(deployment: Deployment, replica: int) -> AsyncIterator[bytes]:
    """Server-sent events, one per new log line, until the engine is gone or the client
    leaves. The runtime's follower blocks, so it runs in a thread and hands lines over."""
    handles = [h for h in handles_of(deployment) if h.get("replica", 0) == replica]
    if not handles:
        yield b"event: end\ndata: the engine is not running\n\n"
        return
    runtime = get_runtime(deployment.runtime)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=1000)
    leaving = threading.Event()

    def pump() -> None:
        try:
            for line in runtime.follow_log(handles[0], leaving):
                if leaving.is_set():
                    return
                asyncio.run_coroutine_threadsafe(queue.put(line), loop).result()
        except EngineUnreachable as exc:
            asyncio.run_coroutine_threadsafe(queue.put(f"[{exc}]"), loop).result()
        finally:
            if not leaving.is_set():
                asyncio.run_coroutine_threadsafe(queue.put(None), loop)

    threading.Thread(target=pump, daemon=True).start()
    try:
        # A comment first, so the client sees the stream open before any line.
        yield b": following\n\n"
        while (line := await queue.get()) is not None:
            yield f"data: {line}\n\n".encode()
        yield b"event: end\ndata: the engine is gone\n\n"
    finally:
        leaving.set()
