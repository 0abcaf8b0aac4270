"""Each engine's own load, as its Prometheus gauges say it: the requests it runs and holds
waiting (vLLM's num_requests_running and _waiting, llama.cpp's requests_processing and
_deferred) and, where it says it, how full its KV cache is (vLLM's kv_cache_usage_perc).

The replica choice weighs a replica by the requests the gateway has on it plus those its
engine held beyond the gateway's own when it was last read (what other gateways, or callers
that reach the engine directly, sent), and treats one whose KV cache is nearly full as at its
bound. The gauges lag: a request the gateway has just seen end still counts in them, which is
why only what exceeded the gateway's own count at the read is added.
Read every READ_S by a task of the event loop that chooses, for the replicas chosen among in
the last WATCH_S only; an engine that does not answer in READ_TIMEOUT counts as the gateway
sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiohttp

from deployments.engine_metrics import parse_gauges
from deployments.loaders import LOADERS
from openai_api.forwarder import forwarder

if TYPE_CHECKING:
    from collections.abc import Callable

READ_S: Final = 1.0
WATCH_S: Final = 60.0
READ_TIMEOUT: Final = aiohttp.ClientTimeout(total=0.5)
FULL: Final = 0.95  # of its KV cache: a request placed there waits or preempts another


@dataclass(frozen=True, slots=True)
class Seen:
    others: int  # running and waiting beyond the gateway's own, when read
    full: bool
    at: float  # monotonic


class EngineLoads:
    def __init__(self, ours: Callable[[str], int]) -> None:
        self.ours = ours  # the gateway's requests on a replica now
        self.seen: dict[str, Seen] = {}
        self.watched: dict[str, tuple[str, float]] = {}  # url -> (its loader, last chosen)
        self.task: asyncio.Task[None] | None = None

    def watch(self, urls: tuple[str, ...], loader: str) -> None:
        """The replicas a choice was made among: read from now on, while chosen among."""
        if not (found := LOADERS.get(loader)) or not found.running_gauge:
            return
        now = time.monotonic()
        for url in urls:
            self.watched[url] = (loader, now)
        if self.task is None or self.task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: a test's bare call
                self.task = asyncio.get_running_loop().create_task(self.read_forever())

    def of(self, url: str) -> Seen | None:
        seen = self.seen.get(url)
        if seen is None or time.monotonic() - seen.at > 5 * READ_S:
            return None
        return seen

    async def read_forever(self) -> None:
        while self.watched:
            now = time.monotonic()
            for url in [u for u, (_, at) in self.watched.items() if now - at > WATCH_S]:
                del self.watched[url]
                self.seen.pop(url, None)
            reads = [self.read(url, loader) for url, (loader, _) in list(self.watched.items())]
            await asyncio.gather(*reads)
            await asyncio.sleep(READ_S)

    async def read(self, url: str, loader_name: str) -> None:
        loader = LOADERS[loader_name]
        names = {loader.running_gauge or "", loader.waiting_gauge or "", *loader.kv_usage_gauges}
        try:
            async with forwarder.session(url).get(url + "/metrics", timeout=READ_TIMEOUT) as answer:
                if answer.status != 200:
                    return
                text = (await answer.text())[: 1 << 20]
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return
        gauges = parse_gauges(text, names)
        if loader.running_gauge not in gauges:
            return
        requests = gauges[loader.running_gauge or ""] + gauges.get(loader.waiting_gauge or "", 0)
        usage = max((gauges.get(n, 0.0) for n in loader.kv_usage_gauges), default=0.0)
        # vLLM says a fraction; some builds a percentage.
        full = (usage / 100 if usage > 1 else usage) >= FULL
        others = max(0, round(requests) - self.ours(url))
        self.seen[url] = Seen(others, full, time.monotonic())
