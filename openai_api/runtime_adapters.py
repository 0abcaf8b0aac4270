"""LoRA adapters a vLLM base loads while it runs: on an adapter's first request to a replica
(`/v1/load_lora_adapter`), at most its base's `max_loras` per replica (the least recently
used is unloaded to make room), and unloaded once unused for the adapter's idle timeout.

Per gateway process: each keeps its own view of what a replica holds, checked against the
engine's own list (`/v1/models`) when it is older than VERIFY_S, so an engine restarted on
the same address, or an adapter another process unloaded, is loaded again rather than
answered 404.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import aiohttp

from openai_api.errors import GatewayError
from openai_api.forwarder import forwarder

if TYPE_CHECKING:
    from openai_api.catalog import Route

log = logging.getLogger(__name__)
VERIFY_S = 5.0
LOAD_TIMEOUT = aiohttp.ClientTimeout(total=120)


SWEEP_S = 30.0


class Replica:
    """What one engine holds, as this process knows it: adapter name -> last use."""

    def __init__(self) -> None:
        self.used: OrderedDict[str, float] = OrderedDict()
        self.idle_s: dict[str, float] = {}  # each adapter's idle timeout
        self.verified = 0.0
        self.lock = asyncio.Lock()


class RuntimeAdapters:
    def __init__(self) -> None:
        self.replicas: dict[str, Replica] = {}
        self.sweeper: asyncio.Task[None] | None = None

    async def ensure(self, route: Route, base_url: str) -> None:
        """The route's adapter loaded in the engine at `base_url` (a 503 where it cannot be)."""
        adapter = route.adapter
        if adapter is None or not adapter.runtime:
            return
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = asyncio.get_running_loop().create_task(self.sweep_forever())
        replica = self.replicas.setdefault(base_url, Replica())
        replica.idle_s[route.name] = route.idle_timeout_s
        now = time.monotonic()
        if route.name in replica.used and now - replica.verified < VERIFY_S:
            replica.used[route.name] = now
            replica.used.move_to_end(route.name)
            return
        async with replica.lock:
            if now - replica.verified >= VERIFY_S:
                await self.verify(base_url, replica)
            if route.name not in replica.used:
                while len(replica.used) >= max(1, adapter.slots):
                    oldest = next(iter(replica.used))
                    await self.unload(base_url, oldest)
                    replica.used.pop(oldest, None)
                await self.load(base_url, route)
            replica.used[route.name] = time.monotonic()
            replica.used.move_to_end(route.name)

    async def verify(self, base_url: str, replica: Replica) -> None:
        """What the engine lists as LoRA adapters (a model with a `parent`)."""
        session = forwarder.session(base_url)
        try:
            async with session.get(base_url + "/v1/models", timeout=LOAD_TIMEOUT) as answer:
                listed = (await answer.json()).get("data", []) if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            listed = None
        if listed is None:
            return  # the engine cannot say: what this process knows stands
        loaded = {m.get("id") for m in listed if isinstance(m, dict) and m.get("parent")}
        for name in list(replica.used):
            if name not in loaded:
                del replica.used[name]
        for name in sorted(n for n in loaded if isinstance(n, str) and n not in replica.used):
            replica.used[name] = 0.0  # another process's: the least recently used here
            replica.used.move_to_end(name, last=False)
        replica.verified = time.monotonic()

    async def load(self, base_url: str, route: Route) -> None:
        assert route.adapter is not None
        body = {"lora_name": route.name, "lora_path": route.adapter.path}
        status, text = await self.post(base_url, "/v1/load_lora_adapter", body)
        if status != 200 and "already" not in text:
            log.warning(
                "loading the adapter %s into %s failed: %s %s", route.name, base_url, status, text
            )
            raise GatewayError(
                503,
                f"The adapter {route.name} could not be loaded into its base"
                f" {route.adapter.base}: {text[:300]}",
                "adapter_not_loaded",
                {"retry-after": "5"},
            )
        log.info("loaded the adapter %s into %s", route.name, base_url)

    async def unload(self, base_url: str, name: str) -> None:
        status, text = await self.post(base_url, "/v1/unload_lora_adapter", {"lora_name": name})
        if status != 200:
            log.info("unloading the adapter %s from %s: %s %s", name, base_url, status, text[:200])

    async def post(self, base_url: str, path: str, body: dict[str, str]) -> tuple[int, str]:
        session = forwarder.session(base_url)
        try:
            async with session.post(base_url + path, json=body, timeout=LOAD_TIMEOUT) as answer:
                return answer.status, await answer.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 0, f"{type(exc).__name__}: {exc}"

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception:  # never the loop's end
                log.exception("the adapters' idle sweep failed")

    async def sweep(self) -> None:
        """Unload each adapter this process loaded and has not used for its idle timeout."""
        now = time.monotonic()
        for base_url, replica in list(self.replicas.items()):
            for name, used in list(replica.used.items()):
                idle = replica.idle_s.get(name)
                if used and idle is not None and now - used > idle:
                    async with replica.lock:
                        await self.unload(base_url, name)
                        replica.used.pop(name, None)


runtime_adapters = RuntimeAdapters()
