"""Cancels of background runs between gateway processes.

A run lives in the process that started it; a cancel may arrive at any process behind the
load balancer. The cancel's status write is what counts (every later write of the run is
conditional on it), and the run's own heartbeat reads it back within a beat. So that the
engine request stops at once, the cancelling process also says so on the channel layer's
group, which every process with runs listens to (across hosts where the layer is Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers, get_channel_layer

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)
GROUP = "modelship-background-runs"
RETRY_S = 5.0


class Notices:
    def __init__(self) -> None:
        self.listener: asyncio.Task[None] | None = None

    def listen(self, on_cancel: Callable[[str], None]) -> None:
        """Start this process's listener, once (a run's start calls it)."""
        if self.listener is None or self.listener.done():
            self.listener = asyncio.ensure_future(self._listen(on_cancel))

    async def _listen(self, on_cancel: Callable[[str], None]) -> None:
        if get_channel_layer() is None:
            return
        # A layer of its own: channels_redis lets one event loop at a time receive on an
        # instance, and the process's shared one is the live admin's (another loop where a
        # test serves the gateway in a thread). Over Redis the group reaches it all the same;
        # the in-memory layer has one process, where a cancel is local anyway.
        layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(GROUP, channel)
                while True:
                    message = await layer.receive(channel)
                    on_cancel(str(message.get("id", "")))
            except asyncio.CancelledError:
                raise
            except Exception:  # the layer's Redis went away: the heartbeat still reads cancels
                log.warning("background-run notices: the channel layer failed", exc_info=True)
                await asyncio.sleep(RETRY_S)

    async def cancelled(self, response_id: str) -> None:
        """Tell every process that `response_id` was cancelled (best effort)."""
        layer = get_channel_layer()
        if layer is None:
            return
        with contextlib.suppress(Exception):
            await layer.group_send(GROUP, {"type": "run.cancel", "id": response_id})


notices = Notices()
