"""The registry of on-demand controllers: one per event loop of this process, each with its
lease renewer. `controller()` is this loop's, made on first use; `controllers()` all of them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings

from ondemand import preparing, wait_figures
from ondemand.adapter import DjangoDeployer
from ondemand.controller import Controller
from ondemand.count_sums import KEEPALIVE_S, PROCESS
from ondemand.counters import CounterPublisher, channel_publisher
from ondemand.scheduler import client, replica_link
from ondemand.scheduler.client import RemoteSlot
from ondemand.state import Slot, View, describe
from openai_api import wait_status
from openai_api.auth import current_key
from openai_api.catalog import Route, catalog
from openai_api.concurrency import Claim, limits
from openai_api.errors import GatewayError
from openai_api.limit_headers import Left

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from contextlib import AbstractAsyncContextManager

    from openai_api.catalog import Key
    from openai_api.dispatch import WaitNotice
    from openai_api.usage.gpu_time import Account

log = logging.getLogger(__name__)
_controllers: dict[asyncio.AbstractEventLoop, Controller] = {}
_renewers: set[asyncio.Task[None]] = set()


def controller() -> Controller:
    loop = asyncio.get_running_loop()
    if loop in _controllers:
        ctl = _controllers[loop]
        # Settings are read per request, so a changed limit applies without a restart.
        configure(ctl)
        return ctl
    if loop not in _controllers:
        ctl = Controller(DjangoDeployer())
        configure(ctl)
        _controllers[loop] = ctl
        # A state change the route table sees (an operator's stop, a start elsewhere) wakes
        # the requests waiting for memory or for a start.
        catalog.listeners.append(ctl.notify)
        publisher = CounterPublisher(channel_publisher(lambda i: _status(ctl, i)))
        ctl.on_counts = publisher.changed
        task = loop.create_task(_renew(ctl, publisher))
        _renewers.add(task)
        task.add_done_callback(_renewers.discard)
    return _controllers[loop]


def configure(ctl: Controller) -> None:
    """The site's settings, read per request, so that a changed limit applies without a
    restart."""
    ctl.queue_timeout_s = settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S
    ctl.max_queued = settings.MSHIP_ONDEMAND_MAX_QUEUED
    ctl.max_waiting_per_key = settings.MSHIP_MAX_WAITING_PER_KEY
    ctl.aging_s = settings.MSHIP_PRIORITY_AGING_S
    ctl.collation_s = settings.MSHIP_COLLATION_S
    ctl.max_loaded = settings.MSHIP_MAX_LOADED_MODELS
    ctl.evict_unused = settings.MSHIP_MAKE_ROOM_FROM == "unused"


def controllers() -> list[Controller]:
    """The controllers of this process (one per event loop that served on-demand traffic)."""
    return list(_controllers.values())


class ControllerSlots:
    """On-demand slots for the /v1 dispatcher: from the site's scheduler where this process
    is one of several (ondemand/scheduler/), else from this event loop's controller."""

    async def acquire(
        self, route: Route, notice: WaitNotice | None, waited_s: float = 0.0
    ) -> Slot | RemoteSlot:
        key = current_key.get()
        priority, key_id = (key.priority, key.id) if key else (0, None)
        to = client.link()
        if to is not None:
            return await client.slot(to, fields_of(route), priority, key_id, notice, waited_s)
        view = view_of_route(route)
        return await acquire_here(controller(), view, priority, key_id, notice, waited_s)

    def release(self, slot: Slot | RemoteSlot) -> None:
        if isinstance(slot, RemoteSlot):
            if not slot.released:
                slot.released = True
                slot.link.release(slot.id)
            return
        controller().release(slot)

    async def status(self, route: Route) -> dict[str, Any] | None:
        to = client.link()
        if to is not None:
            return await client.status(to, route.deployment_id, route.state)
        return status_here(controller(), route.deployment_id, route.state)


class SitePlaces:
    """max_concurrency places for the /v1 dispatcher: the site's scheduler's where this
    process is one of several, else this event loop's."""

    def held(self, route: Route, key: Key | None) -> AbstractAsyncContextManager[None]:
        to = client.link()
        if to is not None:
            return client.place(to, Claim.of(route, key))
        return limits().held(route, key)


class SiteChoices:
    """The replica choice and vLLM adapters' residency for the /v1 dispatcher: the site's
    scheduler's where this process is one of several (None: this process's own)."""

    def replica(
        self, urls: tuple[str, ...], deployment: str
    ) -> AbstractAsyncContextManager[str] | None:
        to = client.link()
        return None if to is None else replica_link.replica(to, urls, deployment)

    def adapter(self, route: Route, url: str) -> AbstractAsyncContextManager[None] | None:
        to = client.link()
        return None if to is None else client.adapter(to, route, url)


T = TypeVar("T")


async def site_or_own(ask: Callable[[client.Link], Awaitable[T]], own: T) -> T:
    """The site scheduler's answer where this process is one of several; `own` where it is
    not, or where the scheduler does not answer (this process judges meanwhile: no request
    fails for it)."""
    to = client.link()
    if to is None:
        return own
    try:
        return await ask(to)
    except GatewayError as exc:
        if exc.code == "scheduler_unavailable":
            return own
        raise


class SiteWindows:
    """Requests per minute per key, counted by the site's scheduler where this process is one
    of several and no Redis holds them (openai_api/rate_limits.py)."""

    async def admit(self, key_id: int, limit: int) -> Left | None:
        said = await site_or_own(lambda to: client.admitted(to, key_id, limit), None)
        return None if said is None else Left(limit, *said)


class SiteBudgets:
    """Token reservations held by the site's scheduler where this process is one of several
    (openai_api/usage/budgets.py)."""

    async def reserve(self, owners: list[dict[str, Any]], tokens: int) -> str | None:
        return await site_or_own(lambda to: client.reserved(to, owners, tokens), None)

    def release(self, reservation_id: str) -> None:
        to = client.link()
        if to is not None:
            to.release(reservation_id)


class SiteMeter:
    """GPU time divided by the site's scheduler where this process is one of several
    (openai_api/usage/gpu_time.py; None: this process's own meter)."""

    def begin(self, url: str, share: float, account: Account) -> client.GpuShare | None:
        """None where this process meters the request: it owns the scheduling, or its link
        is not up (connecting, or the owner away): charged by its own division then, never
        by no one."""
        to = client.link()
        if to is None:
            return None
        if not to.up.is_set():
            to._run()  # connecting: the next requests are the site's
            return None
        return client.GpuShare(to, url, share, account)


async def acquire_here(
    ctl: Controller,
    view: View,
    priority: int,
    key_id: int | None,
    notice: WaitNotice | None,
    waited_s: float = 0.0,
) -> Slot:
    """A slot from this process's controller (the owner's, or a lone gateway's); `waited_s`
    of its queue timeout already spent (a max_concurrency wait)."""
    deployment_id = view.id

    def figures() -> dict[str, Any] | None:
        return wait_figures.of(ctl, deployment_id)

    on_queued = None if notice is None else lambda: notice.on_queued(figures())
    on_preparing = None if notice is None else notice.on_preparing
    wait_status.follow(figures)  # a stream's keepalives say its place, step and estimate
    # A start that installs or pulls first (minutes) is told to the request meanwhile.
    with preparing.listening(deployment_id, on_preparing):
        return await ctl.acquire(
            deployment_id,
            on_queued=on_queued,
            hint=view,
            priority=priority,
            key_id=key_id,
            waited_s=waited_s,
        )


def status_here(ctl: Controller, deployment_id: int, state: str | None) -> dict[str, Any]:
    found = describe(ctl.entry(deployment_id), state)
    return {**found, "waiting": wait_figures.of(ctl, deployment_id)}


def fields_of(route: Route) -> dict[str, Any]:
    """What the scheduler's owner reads of a route (ondemand/scheduler/owner.view_of)."""
    return {
        "id": route.deployment_id,
        "name": route.name,
        "state": route.state,
        "on_demand": route.on_demand,
        "idle_timeout_s": route.idle_timeout_s,
        "urls": list(route.urls),
    }


def view_of_route(route: Route) -> View:
    """The controller's view of a deployment, from the gateway's route table (no query)."""
    return View(
        id=route.deployment_id,
        name=route.name,
        state=route.state,
        on_demand=route.on_demand,
        need_gib=0.0,  # only starts and make-room read it, and they read the row
        idle_timeout_s=route.idle_timeout_s,
        urls=route.urls,
    )


def _status(ctl: Controller, deployment_id: int) -> dict[str, Any]:
    route = catalog.snapshot.by_id(deployment_id) if catalog.snapshot else None
    status = ctl.status(None if route is None else view_of_route(route), deployment_id)
    figures = wait_figures.shown(wait_figures.of(ctl, deployment_id))
    return {**status, **figures, "process": PROCESS}  # a page sums the processes' counts


async def _renew(ctl: Controller, publisher: CounterPublisher) -> None:
    """Slots that outlast their lease (long streams) keep it: a timer, since nothing else
    happens while a stream runs. Counts that are not zero are said again, so that a page
    summing the processes' counts can tell a live process from a dead one."""
    while True:
        await asyncio.sleep(KEEPALIVE_S)
        with contextlib.suppress(Exception):
            await ctl.renew_leases()
        for deployment_id, entry in list(ctl.entries.items()):
            if entry.inflight or entry.queued:
                publisher.changed(deployment_id)
