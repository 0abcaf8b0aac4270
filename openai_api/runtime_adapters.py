"""LoRA adapters a vLLM base loads while it runs: on an adapter's first request to a replica
(`/v1/load_lora_adapter`), at most its base's `max_loras` per replica (the least recently
used that no request is using is unloaded to make room), and unloaded once unused for its
base's idle timeout.

Per gateway process: each keeps its own view of what a replica holds, with the files each
adapter was loaded from, checked against the engine's own list (`/v1/models`: a LoRA's
`root` is its files) when it is older than VERIFY_S, so an engine restarted on the same
address, an adapter another process unloaded, or one whose files changed, is loaded again.
Adapters another process loaded count as just used here: neither process evicts the
other's first.
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
SWEEP_S = 30.0
LOAD_TIMEOUT = aiohttp.ClientTimeout(total=120)


class Replica:
    """What one engine holds, as this process knows it."""

    def __init__(self) -> None:
        self.used: OrderedDict[str, float] = OrderedDict()  # name -> last use, oldest first
        self.paths: dict[str, str] = {}  # name -> the files it was loaded from
        self.inflight: dict[str, int] = {}  # requests using it now: never evicted
        self.idle_s: dict[str, float] = {}
        self.mine: set[str] = set()  # loaded by this process: its sweep's to unload
        self.verified = 0.0
        self.lock = asyncio.Lock()

    def touch(self, name: str) -> None:
        self.used[name] = time.monotonic()
        self.used.move_to_end(name)

    def forget(self, name: str) -> None:
        self.used.pop(name, None)
        self.paths.pop(name, None)
        self.mine.discard(name)


class RuntimeAdapters:
    def __init__(self) -> None:
        self.replicas: dict[str, Replica] = {}
        self.sweeper: asyncio.Task[None] | None = None

    async def ensure(self, route: Route, base_url: str) -> None:
        """The route's adapter loaded in the engine at `base_url`, and counted as in use
        until `release` (a 503 where it cannot be loaded)."""
        adapter = route.adapter
        if adapter is None or not adapter.runtime:
            return
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = asyncio.get_running_loop().create_task(self.sweep_forever())
        replica = self.replicas.setdefault(base_url, Replica())
        replica.idle_s[route.name] = route.idle_timeout_s
        replica.inflight[route.name] = replica.inflight.get(route.name, 0) + 1
        try:
            fresh = time.monotonic() - replica.verified < VERIFY_S
            if not (fresh and replica.paths.get(route.name) == adapter.path):
                async with replica.lock:
                    await self.loaded(route, base_url, replica)
            replica.touch(route.name)
        except BaseException:
            self.release(route, base_url)
            raise

    def adopt(self, route: Route, base_url: str) -> None:
        """An adapter a gateway was using before this process owned the residency (it
        says so as it connects): counted in use, checked against the engine's list at the
        next request."""
        replica = self.replicas.setdefault(base_url, Replica())
        replica.idle_s[route.name] = route.idle_timeout_s
        replica.inflight[route.name] = replica.inflight.get(route.name, 0) + 1
        replica.touch(route.name)

    def release(self, route: Route, base_url: str) -> None:
        replica = self.replicas.get(base_url)
        if replica is not None and replica.inflight.get(route.name):
            replica.inflight[route.name] -= 1

    async def loaded(self, route: Route, base_url: str, replica: Replica) -> None:
        """Under the replica's lock: its list checked, room made, the adapter loaded."""
        assert route.adapter is not None
        if time.monotonic() - replica.verified >= VERIFY_S:
            await self.verify(base_url, replica)
        path = route.adapter.path
        if route.name in replica.paths and replica.paths[route.name] != path:
            await self.unload(base_url, route.name)  # its files changed: loaded anew
            replica.forget(route.name)
        if route.name in replica.paths:
            return
        while len(replica.used) >= max(1, route.adapter.slots):
            idle = [n for n in replica.used if not replica.inflight.get(n)]
            if not idle:
                break  # every slot is serving: loaded beside them
            await self.unload(base_url, idle[0])
            replica.forget(idle[0])
        await self.load(base_url, route)
        replica.paths[route.name] = path
        replica.mine.add(route.name)

    async def verify(self, base_url: str, replica: Replica) -> None:
        """What the engine lists as LoRA adapters (a model with a `parent`), and their files."""
        session = forwarder.session(base_url)
        try:
            async with session.get(base_url + "/v1/models", timeout=LOAD_TIMEOUT) as answer:
                listed = (await answer.json()).get("data", []) if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            listed = None
        if not isinstance(listed, list):
            return  # the engine cannot say: what this process knows stands
        loaded = {
            str(m["id"]): str(m.get("root") or "")
            for m in listed
            if isinstance(m, dict) and m.get("parent") and m.get("id")
        }
        for name in list(replica.used):
            if name not in loaded:
                replica.forget(name)
        for name, root in loaded.items():
            replica.paths[name] = root or replica.paths.get(name, "")
            if name not in replica.used:
                replica.touch(name)  # another process's: as if just used here
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
        """Unload each adapter this process loaded that no request uses and none has used
        for its idle timeout (checked again under the replica's lock)."""
        for base_url, replica in list(self.replicas.items()):
            async with replica.lock:
                now = time.monotonic()
                for name in list(replica.mine):
                    idle = replica.idle_s.get(name)
                    used = replica.used.get(name, now)
                    if idle is not None and not replica.inflight.get(name) and now - used > idle:
                        await self.unload(base_url, name)
                        replica.forget(name)


runtime_adapters = RuntimeAdapters()
