"""The runtime interface: how an engine is launched, watched and stopped.

A runtime turns a launch description into a running engine and a JSON-able handle that is
stored on the deployment row, so that any process (the ASGI server, a django-q worker, a
restarted Modelship) can watch, stop or adopt the engine later. The process runtime is the
embedded default; docker (and later ray) sit beside it behind the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator

Handle = dict[str, Any]


class RuntimeError_(Exception):
    """A runtime could not do what it was asked; the message is for the operator."""


class EngineUnreachable(RuntimeError_):
    """The runtime's own service (the Docker Engine) does not answer. Nothing is known about
    the engines, so callers leave deployments as they are instead of failing them."""


def gpu_list(gpus: list[int]) -> str:
    """Device indices as CUDA_VISIBLE_DEVICES and the engines' labels write them."""
    return ",".join(str(index) for index in gpus)


def parse_gpu_list(text: str) -> list[int] | None:
    """The reverse of gpu_list; None for anything else (a UUID list, a typo)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


@dataclass(frozen=True)
class Launch:
    deployment_id: int
    name: str
    replica: int
    argv: list[str]
    health_path: str
    fingerprint: str
    env: dict[str, str] = field(default_factory=dict)
    image: str = ""
    # Container settings (the docker runtime): merged `docker:` options, the model to mount.
    options: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    num_gpus: float | None = None
    # What the deployment declares it needs (the ray runtime asks Ray for it), and Ray's
    # custom resources (a node label, an accelerator kind).
    memory_gib: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    # The GPUs (device indices) placed for it on a GPU host, [] for none; None on a host
    # without GPUs (nothing is hidden from the engine there).
    gpus: list[int] | None = None
    # Host folders the engine needs at the same path, read-only (its engine environment).
    mounts: list[str] = field(default_factory=list)
    # The model cache (HF_HOME) the engines share, mounted read-write in a container.
    cache: str = ""


class Runtime(Protocol):
    name: str

    def prepare(self, image: str, progress: Callable[[str], None] | None = None) -> None:
        """What a launch needs that may take long (a container's image, pulled), done
        before the start-up gate is taken; `progress` is told how it goes."""
        ...

    def launch(self, launch: Launch) -> Handle:
        """Start an engine; the handle carries at least ``url`` (its base URL)."""
        ...

    def is_alive(self, handle: Handle) -> bool: ...

    def exit_reason(self, handle: Handle) -> str:
        """Why a dead engine is gone (exit code, signal, out of memory), as far as known."""
        ...

    def stop(self, handle: Handle, grace_s: float) -> None:
        """Ask the engine to stop, kill it after the grace period, return once it is gone."""
        ...

    def log_tail(self, handle: Handle, lines: int) -> str: ...

    def follow_log(self, handle: Handle, stop: threading.Event | None = None) -> Iterator[str]:
        """New log lines as they come, until the engine is gone or ``stop`` is set
        (blocking; a runtime may only notice ``stop`` at its next line)."""
        ...

    def managed(self) -> list[Handle] | None:
        """Every engine of this site the runtime can find, or None when it cannot enumerate
        them (a process runtime only knows the handles it was given)."""
        ...

    def remove(self, handle: Handle) -> None:
        """Remove what is left of an engine that is not running (an orphan)."""
        ...

    def gpus_of(self, handle: Handle) -> list[int] | None:
        """The GPUs a running engine was given, read back from the engine itself (its
        environment or labels); None when it says nothing (started on a host without)."""
        ...
