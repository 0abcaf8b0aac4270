"""What a request that Modelship makes wait is told of its wait: what it waits for (a place
under a max_concurrency, memory in the queue, its model's start or wake), its place, what the
start does now (an image pull, an engine install, the health wait) and an estimate of the
seconds left, from the model's measured starts.

A streaming request hears it as an SSE comment on each keepalive, `: modelship-wait {...}`
(JSON): comments are what SSE clients skip, the official OpenAI and Anthropic SDKs among them,
so a client that does not look for it sees nothing. Whoever makes the request wait sets the
figures' source on the request's WaitStatus (`current`), which the keepalives read.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

PREFIX = b": modelship-wait "


@dataclass
class WaitStatus:
    """One waiting request's figures, read when they are said (an estimate runs down)."""

    source: Callable[[], dict[str, Any] | None] | None = None

    def figures(self) -> dict[str, Any] | None:
        return None if self.source is None else self.source()


current: ContextVar[WaitStatus | None] = ContextVar("modelship_wait_status", default=None)


def follow(source: Callable[[], dict[str, Any] | None]) -> None:
    """The request in this context waits on `source`'s figures from now on."""
    status = current.get()
    if status is not None:
        status.source = source


def key_of(figures: dict[str, Any]) -> tuple[Any, ...]:
    """What makes the figures worth saying again at once (an estimate alone runs down)."""
    return (figures.get("waiting_for"), figures.get("position"), figures.get("doing"))


def comment(figures: dict[str, Any]) -> bytes:
    return PREFIX + json.dumps(figures, separators=(",", ":")).encode() + b"\n\n"


def words(figures: dict[str, Any]) -> str:
    """The figures in a sentence's words, for the queued notice: "place 2 in the queue,
    about 40 s"; "" when there is nothing to say."""
    parts = []
    if figures.get("position"):
        parts.append(f"place {figures['position']} in the queue")
    if figures.get("eta_s") is not None:
        parts.append(f"about {round(figures['eta_s'])} s")
    return ", ".join(parts)
