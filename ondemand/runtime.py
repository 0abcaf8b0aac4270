"""The gateway process's controller: one per event loop, with its lease renewer."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.conf import settings

from ondemand.adapter import DjangoDeployer
from ondemand.controller import LEASE_RENEW_S, Controller
from openai_api.catalog import catalog

log = logging.getLogger(__name__)
_controllers: dict[asyncio.AbstractEventLoop, Controller] = {}
_renewers: set[asyncio.Task[None]] = set()


def controller() -> Controller:
    loop = asyncio.get_running_loop()
    if loop in _controllers:
        ctl = _controllers[loop]
        # Settings are read per request, so a changed limit applies without a restart.
        ctl.queue_timeout_s = settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S
        ctl.max_queued = settings.MSHIP_ONDEMAND_MAX_QUEUED
        return ctl
    if loop not in _controllers:
        ctl = Controller(
            DjangoDeployer(),
            queue_timeout_s=settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S,
            max_queued=settings.MSHIP_ONDEMAND_MAX_QUEUED,
        )
        _controllers[loop] = ctl
        # A state change the route table sees (an operator's stop, a start elsewhere) wakes
        # the requests waiting for memory or for a start.
        catalog.listeners.append(ctl.notify)
        task = loop.create_task(_renew(ctl))
        _renewers.add(task)
        task.add_done_callback(_renewers.discard)
    return _controllers[loop]


async def _renew(ctl: Controller) -> None:
    """Slots that outlast their lease (long streams) keep it: a timer, since nothing else
    happens while a stream runs."""
    while True:
        await asyncio.sleep(LEASE_RENEW_S / 2)
        with contextlib.suppress(Exception):
            await ctl.renew_leases()
