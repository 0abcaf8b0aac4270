"""From a route to an engine: the seam where the on-demand controller plugs in.

Here a ready deployment gets a replica (openai_api/routing/: the conversation's, its prefix's,
or the least loaded); anything else is 503 with its state. The on-demand issue replaces `slot` for
on-demand deployments with the controller's acquire and release.
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError

from common.redis_errors import with_redis_errors
from deployments.models import State
from openai_api.auth import current_key
from openai_api.catalog import catalog
from openai_api.concurrency import Limits, limits
from openai_api.errors import GatewayError
from openai_api.routing import hints, slots
from openai_api.routing.router import Router
from openai_api.routing.slots import UNPINNED
from openai_api.runtime_adapters import runtime_adapters

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    from openai_api.catalog import Key, Route

log = logging.getLogger(__name__)


class Slot(Protocol):
    urls: tuple[str, ...]


class WaitNotice(Protocol):
    """What a request that waits for an on-demand slot is told (openai_api/queued_notice)."""

    def on_queued(self, figures: dict[str, Any] | None = None) -> None:
        """It has to wait for memory (once), with its place and estimate where known."""

    def on_preparing(self, doing: str) -> None:
        """The start it waits for is pulling an image or installing an engine environment."""


class OnDemandSlots(Protocol):
    """Where on-demand slots come from: the on-demand app's controller, which it registers
    here at start-up (this package imports nothing of it)."""

    async def acquire(self, route: Route, notice: WaitNotice | None, waited_s: float = 0.0) -> Slot:
        """A slot on the route's deployment. `waited_s`: what the request already waited
        for it (a max_concurrency place), counted against the queue timeout."""
        ...

    def release(self, slot: Any) -> None:
        """Give back a slot this source's acquire returned."""
        ...

    async def status(self, route: Route) -> dict[str, Any] | None:
        """The model's on-demand counts and phase on the site, with `waiting`: the figures
        of its wait (openai_api/wait_status.py), None when nothing waits."""
        ...


class Places(Protocol):
    """Where max_concurrency places come from when the on-demand app runs a site-wide
    scheduler (ondemand/scheduler/): it registers itself here at start-up."""

    def held(self, route: Route, key: Key | None) -> AbstractAsyncContextManager[None]: ...


class SiteState(Protocol):
    """The site's scheduler's replica choice and adapter residency, where this process is
    one of several (the on-demand app registers it at start-up); None: this process's own."""

    def replica(
        self, urls: tuple[str, ...], deployment: str
    ) -> AbstractAsyncContextManager[str] | None: ...

    def adapter(self, route: Route, url: str) -> AbstractAsyncContextManager[None] | None: ...


class Replica:
    """Holds one of `urls` while the block runs: the only one, or the one the router picks
    (openai_api/routing/). A class rather than a generator: it is on every request's path,
    and never waits long (`immediate`: no keepalives are needed while it is taken)."""

    immediate = True
    __slots__ = ("deployment", "router", "slot", "url", "urls")

    def __init__(self, router: Router, urls: tuple[str, ...], deployment: str) -> None:
        self.router = router
        self.urls = urls
        self.deployment = deployment
        self.url = ""
        self.slot = UNPINNED

    async def __aenter__(self) -> str:
        url, pin = await self.router.take(self.urls, self.deployment)
        self.slot = pin.slot if pin is not None else UNPINNED
        self.url = url
        return url

    async def __aexit__(self, kind: object, *exc: object) -> None:
        served = kind is None and slots.served()
        self.router.give(self.url, self.slot, served)


class Dispatcher:
    def __init__(self) -> None:
        self.outstanding: dict[str, int] = {}
        self.router = Router(self.outstanding)
        self.on_demand: OnDemandSlots | None = None
        self.places: Places | None = None
        self.site: SiteState | None = None
        self.now: Callable[[], float] = time.monotonic  # what waits are measured on (a test's)

    def slot(
        self, route: Route, notice: WaitNotice | None = None
    ) -> AbstractAsyncContextManager[str]:
        """An engine base URL to send one request to, held until the answer is sent.
        `notice` hears why an on-demand request waits (memory, an install). A request past
        a max_concurrency first waits for a place (openai_api/concurrency.py)."""
        key = current_key.get()
        held: AbstractAsyncContextManager[str]
        if Limits.binds(route, key):
            held = self.limited_slot(route, key, notice)
        else:
            held = self.unlimited_slot(route, notice)
        if route.adapter is not None and route.adapter.runtime:
            return self.with_adapter(route, held)
        return held

    @asynccontextmanager
    async def with_adapter(
        self, route: Route, held: AbstractAsyncContextManager[str]
    ) -> AsyncIterator[str]:
        """A vLLM adapter's slot: its replica, with the adapter loaded in it (by the site's
        scheduler where this process is one of several: no process unloads an adapter
        another is using)."""
        async with held as url:
            remote = self.site.adapter(route, url) if self.site is not None else None
            if remote is not None:
                async with remote:
                    yield url
                return
            await runtime_adapters.ensure(route, url)
            try:
                yield url
            finally:
                runtime_adapters.release(route, url)

    def unlimited_slot(
        self, route: Route, notice: WaitNotice | None, began: float | None = None
    ) -> AbstractAsyncContextManager[str]:
        if route.on_demand:
            return self.on_demand_slot(route, notice, began)
        self.check_servable(route)
        return self.replica(route.urls, route.name)

    @asynccontextmanager
    async def limited_slot(
        self, route: Route, key: Key | None, notice: WaitNotice | None
    ) -> AsyncIterator[str]:
        if not route.on_demand:
            self.check_servable(route)  # a stopped model's requests are not made to wait
        places = self.places.held(route, key) if self.places else limits().held(route, key)
        # One deadline from here: the wait for a place counts against the on-demand wait's
        # MSHIP_ONDEMAND_QUEUE_TIMEOUT_S, so that the two never add up past LiteLLM's timeout.
        began = self.now()
        async with places, self.unlimited_slot(route, notice, began) as url:
            yield url

    @staticmethod
    def check_servable(route: Route) -> None:
        """503 for an always-on deployment that cannot take a request now (an on-demand one
        is started by its request)."""
        if not route.on_demand and (route.state != State.READY or not route.urls):
            raise GatewayError(
                503,
                f"The model {route.name!r} is not ready: the always-on deployment is"
                f" {route.state}.",
                "model_not_ready",
            )

    def replica(
        self, urls: tuple[str, ...], deployment: str
    ) -> Replica | AbstractAsyncContextManager[str]:
        """One of `urls` held while the block runs (and its slot, where the gateway chooses
        its engine's): chosen by the site's scheduler where there is a choice and this
        process is one of several, else here."""
        hint = hints.current.get()
        if (len(urls) > 1 or (hint is not None and hint.slots)) and self.site is not None:
            remote = self.site.replica(urls, deployment)
            if remote is not None:
                return remote
        return Replica(self.router, urls, deployment)

    @asynccontextmanager
    async def on_demand_slot(
        self, route: Route, notice: WaitNotice | None = None, began: float | None = None
    ) -> AsyncIterator[str]:
        """A slot from the on-demand controller: it may start the model, make room for it
        or queue; the slot is released after the last byte, on every path. `began`: when the
        request began to wait (monotonic), where it waited for a place first."""
        slots = self.on_demand
        if slots is None:
            raise GatewayError(
                503, f"{route.name} is on demand, and no controller runs here.", "not_on_demand"
            )
        try:
            waited_s = 0.0 if began is None else self.now() - began
            slot = await slots.acquire(route, notice, waited_s)
        except with_redis_errors(DatabaseError, OSError) as exc:
            # The controller's database (or broker) is down: say so now rather than hang.
            log.warning("on-demand acquire for %s failed: %r", route.name, exc)
            raise GatewayError(
                503,
                f"{route.name} cannot be started now: the control plane's store is"
                f" unavailable ({exc.__class__.__name__}).",
                "ondemand_unavailable",
                {"retry-after": "5"},
            ) from exc
        try:
            urls = slot.urls or route.urls
            if not urls:
                raise GatewayError(
                    503, f"{route.name} has no engine address yet.", "model_not_ready"
                )
            async with self.replica(urls, route.name) as url:
                yield url
        finally:
            slots.release(slot)


dispatcher = Dispatcher()
# A route table that changed may have stopped an engine: its blocks and slots go.
catalog.listeners.append(dispatcher.router.forget_gone)
