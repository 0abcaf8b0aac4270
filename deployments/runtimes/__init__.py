"""Runtimes by name."""

from __future__ import annotations

from deployments.runtimes.base import EngineUnreachable, Handle, Launch, Runtime, RuntimeError_
from deployments.runtimes.docker import DockerRuntime
from deployments.runtimes.process import ProcessRuntime

_RUNTIMES: dict[str, Runtime] = {"process": ProcessRuntime(), "docker": DockerRuntime()}


def get_runtime(name: str) -> Runtime:
    try:
        return _RUNTIMES[name]
    except KeyError:
        raise RuntimeError_(f"the {name!r} runtime is not available on this site") from None


__all__ = ["EngineUnreachable", "Handle", "Launch", "Runtime", "RuntimeError_", "get_runtime"]
