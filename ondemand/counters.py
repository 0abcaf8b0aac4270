"""Live counters: a change of a deployment's in-flight or queued counts is published to the
channel layer's "deployments" group, at most once a second per deployment. The first change
goes at once; later ones fold into one message a second after the previous, with the counts
as they are then."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer

from ondemand.clock import Clock, SystemClock

GROUP = "deployments"
EVERY_S = 1.0

Publish = Callable[[int], Awaitable[None]]


class CounterPublisher:
    def __init__(self, publish: Publish, clock: Clock | None = None) -> None:
        self.publish = publish
        self.clock = clock or SystemClock()
        self.last: dict[int, float] = {}
        self.pending: dict[int, asyncio.Task[None]] = {}

    def changed(self, deployment_id: int) -> None:
        if deployment_id in self.pending:
            return  # folded into the message already on its way
        due = self.last.get(deployment_id, float("-inf")) + EVERY_S
        self.pending[deployment_id] = asyncio.ensure_future(self._send(deployment_id, due))

    async def _send(self, deployment_id: int, due: float) -> None:
        me = asyncio.current_task()
        try:
            if due > self.clock.now():
                await self.clock.wait(asyncio.Event(), due - self.clock.now())
            self.last[deployment_id] = self.clock.now()
            # From here a change schedules the next message (this one may already be stale
            # when it arrives); that message's task is not ours to forget.
            self._forget(deployment_id, me)
            await self.publish(deployment_id)
        finally:
            self._forget(deployment_id, me)

    def _forget(self, deployment_id: int, task: asyncio.Task[Any] | None) -> None:
        if self.pending.get(deployment_id) is task:
            del self.pending[deployment_id]


def channel_publisher(status: Callable[[int], dict[str, Any]]) -> Publish:
    """Publish {"type": "deployment.ondemand", "id", "ondemand"} to the group."""

    async def publish(deployment_id: int) -> None:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(
                GROUP,
                {
                    "type": "deployment.ondemand",
                    "id": deployment_id,
                    "ondemand": status(deployment_id),
                },
            )

    return publish
