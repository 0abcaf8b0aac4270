"""Runtimes by name."""

from __future__ import annotations

from deployments.runtimes.base import EngineUnreachable, Handle, Launch, Runtime, RuntimeError_
from deployments.runtimes.docker import DockerRuntime
from deployments.runtimes.process import ProcessRuntime
from deployments.runtimes.ray import RayRuntime

_RUNTIMES: dict[str, Runtime] = {
    "process": ProcessRuntime(),
    "docker": DockerRuntime(),
    "ray": RayRuntime(),
}


def get_runtime(name: str) -> Runtime:
    try:
        return _RUNTIMES[name]
    except KeyError:
        raise RuntimeError_(f"the {name!r} runtime is not available on this site") from None


def engine_key(handle: Handle) -> str:
    """What names one engine to its runtime, whoever holds the handle: a container, a job."""
    return str(handle.get("container_id") or handle.get("job") or handle.get("pid") or "")


def names() -> list[str]:
    return list(_RUNTIMES)


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
