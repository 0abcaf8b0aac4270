"""Runtimes by name."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from deployments.runtimes.base import EngineUnreachable, Handle, Launch, Runtime, RuntimeError_
from deployments.runtimes.process import ProcessRuntime
from deployments.runtimes.ray import RayRuntime

if TYPE_CHECKING:
    from collections.abc import Callable


def _docker() -> Runtime:
    # The Docker SDK (and requests) only in a process that uses the docker runtime: not in
    # every gateway process or manage.py command at its start.
    from deployments.runtimes.docker import DockerRuntime  # noqa: PLC0415

    return DockerRuntime()


_MAKERS: dict[str, Callable[[], Runtime]] = {
    "process": ProcessRuntime,
    "docker": _docker,
    "ray": RayRuntime,
}
_RUNTIMES: dict[str, Runtime] = {}
_MAKING = threading.Lock()


def get_runtime(name: str) -> Runtime:
    """The one runtime of that name in this process, made at its first use."""
    runtime = _RUNTIMES.get(name)
    if runtime is not None:
        return runtime
    if name not in _MAKERS:
        raise RuntimeError_(f"the {name!r} runtime is not available on this site")
    with _MAKING:
        if name not in _RUNTIMES:
            _RUNTIMES[name] = _MAKERS[name]()
        return _RUNTIMES[name]


def engine_key(handle: Handle) -> str:
    """What names one engine to its runtime, whoever holds the handle: a container, a job."""
    return str(handle.get("container_id") or handle.get("job") or handle.get("pid") or "")


def names() -> list[str]:
    return list(_MAKERS)


__all__ = [
    "EngineUnreachable",
    "Handle",
    "Launch",
    "Runtime",
    "RuntimeError_",
    "engine_key",
    "get_runtime",
    "names",
]
