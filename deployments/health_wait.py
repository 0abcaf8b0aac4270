"""Waiting for a launched engine to answer its health path, and saying why it did not."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx

from deployments import engine_secrets
from deployments.loaders import get_loader
from deployments.runtimes import Handle, get_runtime

if TYPE_CHECKING:
    from deployments.models import Deployment

LOG_TAIL_LINES = 20


class StartFailed(Exception):
    pass


def handles_of(deployment: Deployment) -> list[Handle]:
    return list((deployment.runtime_handle or {}).get("replicas", []))


def failure_reason(deployment: Deployment, handles: list[Handle], headline: str) -> str:
    runtime = get_runtime(deployment.runtime)
    tails = [runtime.log_tail(h, LOG_TAIL_LINES) for h in handles]
    tail = "\n".join(t for t in tails if t)
    return f"{headline}\n--- engine log (last lines) ---\n{tail}" if tail else headline


HEALTH_POLL_FAST_S = 0.02
HEALTH_POLL_FAST_FOR_S = 5.0
HEALTH_POLL_SLOW_S = 0.5


def wait_healthy(deployment: Deployment, handles: list[Handle], timeout_s: float) -> None:
    """Block until every replica answers its health path; StartFailed on a death or timeout."""
    loader = get_loader(deployment.loader)
    runtime = get_runtime(deployment.runtime)
    pending = list(handles)
    began = time.monotonic()
    deadline = began + timeout_s
    delay = HEALTH_POLL_FAST_S
    with httpx.Client(timeout=2.0, auth=engine_secrets.EngineAuth(handles)) as client:
        while pending:
            for handle in list(pending):
                if not runtime.is_alive(handle):
                    why = runtime.exit_reason(handle)
                    raise StartFailed(
                        failure_reason(deployment, [handle], f"{why} during start-up")
                    )
                try:
                    answer = client.get(handle["url"] + loader.health_path)
                except httpx.HTTPError:
                    continue
                if answer.status_code == 200:
                    pending.remove(handle)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise StartFailed(
                    failure_reason(
                        deployment, pending, f"not healthy after {timeout_s:g} s (start timeout)"
                    )
                )
            time.sleep(delay)
            # Every request waiting for an on-demand start waits for this poll: often while
            # a start is young (most are quick), then backing off for a long one (a big
            # model's minutes, whose engine may log each /health).
            if time.monotonic() - began > HEALTH_POLL_FAST_FOR_S:
                delay = min(delay * 1.5, HEALTH_POLL_SLOW_S)
