"""Queueing engine work for the django-q cluster, once the current transaction commits; and
a task's wait that ends when its cluster is asked to stop."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django_q.tasks import async_task

if TYPE_CHECKING:
    from types import FrameType

# The engine work an operation calls for: (task function, deployment id, *its arguments).
# The queue below by default; `manage.py deploy --wait` collects it to run in place.
Work = Callable[..., None]


def enqueue(task: Callable[..., object], deployment_id: int, *args: object) -> None:
    """Queue `task(deployment_id, *args)` once the current transaction commits (a rollback
    queues nothing); one group per deployment."""

    def send() -> None:
        async_task(task, deployment_id, *args, group=f"deployment-{deployment_id}")

    transaction.on_commit(send)


def wait_unless_stopping(seconds: float) -> bool:
    """Wait `seconds` in a cluster worker, or less if the cluster is asked to stop meanwhile;
    whether it was. A stopping cluster waits for each worker's task to end, so a task that
    sleeps (the on-demand reaper's passes) would hold up `serve`'s shutdown until it was
    killed. Outside a worker (a synchronous queue, a test) this is a plain sleep."""
    stop = _cluster_stop_event()
    if stop is None:
        time.sleep(seconds)
        return False
    return bool(stop.wait(seconds))


def _cluster_stop_event() -> Any:
    """The stop event django-q's cluster sets on SIGTERM or SIGINT, shared (through the
    fork) with the worker running this task: the worker was forked by the cluster's
    sentinel, whose frames, still on this process's stack below the worker's loop, hold
    it. None where the worker was not forked (a synchronous queue, another start method)."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "Sentinel" and type(owner).__module__ == "django_q.cluster":
            return getattr(owner, "stop_event", None)
        frame = frame.f_back
    return None
