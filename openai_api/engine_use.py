"""An engine's session in use by one request (`Forwarder.using`): counted in use while the
block runs, and the request metered on its replica's GPU ledger for as long
(openai_api/usage/gpu_time.py): by the site's meter where a scheduler owner answers, else by
this process's; its work said as it ends."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Protocol

from django.conf import settings

from common import tracing
from openai_api import access
from openai_api.catalog import catalog
from openai_api.usage import gpu_time
from openai_api.usage.gpu_time import SiteShare, Ticket, meter

if TYPE_CHECKING:
    from types import TracebackType

    import aiohttp


class Forwarder(Protocol):
    """The engines' sessions (openai_api/forwarder.py), as a block in use needs them."""

    active: dict[str, int]

    def session(self, base_url: str) -> aiohttp.ClientSession: ...

    async def done_with(self, base_url: str) -> None: ...


class Using:
    """`Forwarder.using`'s block, as a class: an async generator's context manager cost the
    gateway's every request a generator and its frames."""

    __slots__ = ("base_url", "began", "forwarder", "on_site", "span", "ticket")

    def __init__(self, forwarder: Forwarder, base_url: str) -> None:
        self.forwarder, self.base_url = forwarder, base_url

    async def __aenter__(self) -> aiohttp.ClientSession:
        forwarder, base_url = self.forwarder, self.base_url
        self.span = tracing.client_span("modelship.engine")
        self.span.__enter__()
        forwarder.active[base_url] = forwarder.active.get(base_url, 0) + 1
        self.ticket: Ticket | None = None
        self.on_site: SiteShare | None = None
        record = access.current.get()
        if record is not None:
            record.reached_engine = True  # its prompt is read from here on: it costs
        share = meter.share_of(base_url, catalog.snapshot)
        if share and settings.MSHIP_USAGE_RECORD:
            # One meter divides a replica's time: the site's where an owner answers.
            account = record.account() if record is not None else (0, 0, "")
            if gpu_time.site is not None:
                self.on_site = gpu_time.site.begin(base_url, share, account)
            if self.on_site is None:
                self.ticket = meter.begin(base_url, share, account)
            self.began = time.perf_counter()
        try:
            return forwarder.session(base_url)
        except BaseException:
            await self.__aexit__(*sys.exc_info())
            raise

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            self.span.__exit__(kind, error, trace)
        finally:
            try:
                if self.ticket is not None or self.on_site is not None:
                    record = access.current.get()
                    work = record.work(self.began) if record is not None else None
                    spent: float | None
                    if self.on_site is not None:
                        spent = await self.on_site.spent(work)
                    else:
                        assert self.ticket is not None
                        spent = meter.end(self.ticket, work)
                    self.ticket = self.on_site = None
                    if record is not None and spent:
                        record.gpu_seconds += spent  # its log line's figure, as divided yet
            finally:
                await self.forwarder.done_with(self.base_url)
