"""An image pull's progress, from the Docker Engine's stream of per-layer events, as one line
for the deployment's state reason, at most once a second (a pull of 10 GB sends thousands)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

DONE = frozenset({"Pull complete", "Already exists"})
MB = 1e6


@dataclass
class Layer:
    current: int = 0
    total: int = 0
    done: bool = False


@dataclass
class PullProgress:
    image: str
    report: Callable[[str], None]
    every_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    layers: dict[str, Layer] = field(default_factory=dict)
    last_report: float = float("-inf")

    def update(self, event: dict[str, Any]) -> None:
        """One event of the pull's stream: {"id": layer, "status", "progressDetail"}."""
        layer_id = event.get("id")
        status = str(event.get("status", ""))
        if not layer_id or layer_id == self.image.rpartition(":")[2]:
            return  # the image's own lines ("Pulling from …", "Digest: …")
        layer = self.layers.setdefault(str(layer_id), Layer())
        detail = event.get("progressDetail") or {}
        if status == "Downloading" and detail.get("total"):
            layer.current, layer.total = int(detail.get("current", 0)), int(detail["total"])
        if status in DONE or status == "Download complete":
            layer.current = layer.total
        if status in DONE:
            layer.done = True
        if self.clock() - self.last_report >= self.every_s:
            self.last_report = self.clock()
            self.report(self.line())

    def line(self) -> str:
        done = sum(1 for layer in self.layers.values() if layer.done)
        current = sum(layer.current for layer in self.layers.values())
        total = sum(layer.total for layer in self.layers.values())
        sizes = f", {current / MB:.1f} of {total / MB:.1f} MB" if total else ""
        return f"pulling image {self.image}: {done} of {len(self.layers)} layers{sizes}"
