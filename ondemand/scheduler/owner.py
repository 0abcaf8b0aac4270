"""The scheduler's owner: the one process of a site that holds the on-demand controller (slots,
queue, make-room, backoff, leases) and the max_concurrency places, for every gateway process
and host. `manage.py scheduler` runs it; `serve` starts it beside its workers.

Each gateway connects once (ondemand/scheduler/client.py) and asks; each question runs here as
its own task, in the one event loop the controller and the limits live in, so that they see
every request of the site as one process's would. What a gateway holds is tied to its link:
when the link ends (the process died, its host went away) every slot and place it held is
released and every question it had waiting is dropped, at once.

A new owner (a restart) grants nothing for MSHIP_SCHEDULER_REBUILD_S: the gateways reconnect
within it and say what they hold, which is counted first; the leases and the engines' states
are read from the database and the engines as they always are.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import math
import os
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import DatabaseError

from common.redis_errors import with_redis_errors
from ondemand import registry
from ondemand.scheduler import client, gpu_said, reservations, wire
from ondemand.scheduler.asked import adapter_route, as_routed, claim_of, rated, view_of
from openai_api import access, wait_status
from openai_api.auth import RateLimiter
from openai_api.catalog import catalog
from openai_api.concurrency import limits
from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError
from openai_api.routing import hints
from openai_api.routing.hints import Hint
from openai_api.routing.slots import UNPINNED
from openai_api.runtime_adapters import runtime_adapters
from openai_api.usage import recording
from openai_api.usage.gpu_time import GpuMeter, Ticket

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from ondemand.state import Slot

log = logging.getLogger(__name__)
FIGURES_EVERY_S = 1.0  # a waiting request's figures are said again this often when changed
MAX_GREETING = 64  # links at once that have not proved the site's key
MAX_ASKING = 100_000  # questions under way on one link (a gateway's requests waiting)
# The site's GPU time, divided among every gateway's requests on each replica and booked here.
meter = GpuMeter(book=recording.book_gpu)
# The site's requests per minute per key, where no Redis holds them (openai_api/rate_limits).
windows = RateLimiter()


class Marks:
    """Stands for a request's access record while a question runs here: the controller
    marks on it why the request waited, the router which replica it chose and why, and the
    answer carries that back."""

    waited = ""
    replica: int | None = None
    routed_by = ""


def refusal(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, GatewayError):
        return {
            "status": exc.status,
            "message": exc.message,
            "code": exc.code,
            "headers": exc.headers,
        }
    if isinstance(exc, with_redis_errors(DatabaseError, OSError)):
        return {
            "status": 503,
            "message": "The control plane's store is unavailable"
            f" ({exc.__class__.__name__}); try again shortly.",
            "code": "ondemand_unavailable",
            "headers": {"retry-after": "5"},
        }
    log.exception("a scheduling question failed", exc_info=exc)
    return {"status": 500, "message": "The scheduler failed.", "code": "scheduler_error"}


class Notice:
    """A waiting request's notice (openai_api/queued_notice.py), said over its link."""

    def __init__(self, gateway: Gateway, ask_id: str) -> None:
        self.gateway, self.ask_id = gateway, ask_id

    def on_queued(self, figures: dict[str, Any] | None = None) -> None:
        self.gateway.send({"id": self.ask_id, "ev": "queued", "figures": figures})

    def on_preparing(self, doing: str) -> None:
        self.gateway.send({"id": self.ask_id, "ev": "preparing", "doing": doing})


class Gateway:
    """One gateway process's link: its questions under way, and what it holds."""

    def __init__(self, owner: Owner, writer: asyncio.StreamWriter, name: str) -> None:
        self.owner, self.writer, self.name = owner, writer, name
        self.asking: dict[str, asyncio.Task[None]] = {}
        self.waits: dict[str, wait_status.WaitStatus] = {}
        self.said: dict[str, dict[str, Any] | None] = {}
        self.held: dict[str, Callable[[], object]] = {}
        # A pinned slot whose request failed: what it holds is not known (routing/slots.py).
        self.spoil: dict[str, Callable[[], object]] = {}
        # GPU time under way: each request's ticket on the site's meter.
        self.metered: dict[str, Ticket] = {}

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(wire.encode(message))

    def adopt(self, holding: list[Any]) -> None:
        """What the gateway held before it connected (to an owner that restarted since)."""
        for item in holding:
            if not isinstance(item, dict):
                continue
            held_id = str(item.get("id"))
            if item.get("kind") == "slot":
                ctl = registry.controller()
                taken = ctl.adopt(int(item["deployment"]), tuple(item.get("urls") or ()))
                self.held[held_id] = functools.partial(ctl.release, taken)
            elif item.get("kind") == "place":
                places = limits()
                ticket = places.adopt(claim_of(item["claim"]))
                self.held[held_id] = functools.partial(places.leave, ticket)
            elif item.get("kind") == "replica":
                url = str(item["url"])
                outstanding = dispatcher.router.outstanding
                outstanding[url] = outstanding.get(url, 0) + 1
                slot = item.get("slot")
                slot = slot if type(slot) is int else UNPINNED
                self.held[held_id] = functools.partial(dispatcher.router.give, url, slot)
            elif item.get("kind") == "adapter":
                route, url = adapter_route(item["route"]), str(item["url"])
                runtime_adapters.adopt(route, url)
                self.held[held_id] = functools.partial(runtime_adapters.release, route, url)
            elif item.get("kind") == "gpu":
                self.meter_from(held_id, item)  # metered from now: before, no one saw it

    def meter_from(self, held_id: str, said: dict[str, Any]) -> None:
        """A request began on a replica with a GPU share: in its division until it ends."""
        url, share, account = gpu_said.begun(said)
        if held_id in self.held or held_id in self.asking or len(self.metered) >= MAX_ASKING:
            raise wire.WireError(f"a GPU share's id in use, or too many: {held_id!r}")
        self.metered[held_id] = meter.begin(url, share, account)
        self.held[held_id] = functools.partial(self.unmetered, held_id, None)

    def unmetered(self, held_id: str, said: Any) -> float | None:
        """The request ended having done the work `said` ([prompt tokens computed, output
        tokens, seconds to its first byte or None]; None, or not that: not counted, it is
        charged its time): what the site's division gave it so far (None: not begun here)."""
        work = gpu_said.work_of(said)  # read first: nothing it says leaves a ticket behind
        ticket = self.metered.pop(held_id, None)
        return None if ticket is None else meter.end(ticket, work)

    def handle(self, message: dict[str, Any]) -> None:
        op, ask_id = message.get("op"), str(message.get("id"))[:32]
        if op in ("slot", "place", "status", "replica", "adapter", "rpm", "reserve"):
            if ask_id in self.asking or ask_id in self.held:
                raise wire.WireError(f"a question id in use: {ask_id!r}")
            if len(self.asking) >= MAX_ASKING:
                raise wire.WireError("too many questions under way on one link")
            work = {
                "slot": self.slot,
                "place": self.place,
                "status": self.status,
                "replica": self.replica,
                "adapter": self.adapter,
                "rpm": self.rpm,
                "reserve": reservations.reserve,
            }[op]
            self.asking[ask_id] = asyncio.create_task(self.answer(ask_id, work(ask_id, message)))
        elif op == "cancel":
            if (task := self.asking.pop(ask_id, None)) is not None:
                task.cancel()
            self.release(ask_id)
        elif op == "release":
            if (spoil := self.spoil.pop(ask_id, None)) is not None and message.get("failed"):
                spoil()
            self.release(ask_id)
        elif op == "gpu":
            self.meter_from(ask_id, message)
        elif op == "rpm_note":
            key, limit = rated(message)
            self.owner.counted(key, limit, windows.note(key, limit))
        elif op == "gpu_end":
            self.held.pop(ask_id, None)
            spent = self.unmetered(ask_id, message.get("work"))
            self.send({"id": ask_id, "ok": {"spent": spent}})
        else:
            raise wire.WireError(f"an unknown operation {op!r}")

    def release(self, ask_id: str) -> None:
        if (give_back := self.held.pop(ask_id, None)) is not None:
            give_back()

    async def answer(
        self, ask_id: str, work: Coroutine[Any, Any, tuple[dict[str, Any], Callable[[], None]]]
    ) -> None:
        marks = Marks()
        access.current.set(cast("access.RequestRecord", marks))
        status = wait_status.WaitStatus()
        wait_status.current.set(status)
        self.waits[ask_id] = status
        try:
            await self.owner.rebuilt.wait()
        except asyncio.CancelledError:
            work.close()  # never begun
            self._forget(ask_id)
            return
        try:
            granted, give_back = await work
        except asyncio.CancelledError:
            return  # its asker gave up, or its link ended
        except Exception as exc:
            self.send({"id": ask_id, "error": refusal(exc), "waited": marks.waited})
        else:
            if self.asking.get(ask_id) is None:
                give_back()  # cancelled as it was granted
            else:
                if give_back is not nothing:  # a status holds nothing to give back
                    self.held[ask_id] = give_back
                self.send({"id": ask_id, "ok": granted, "waited": marks.waited})
        finally:
            self._forget(ask_id)

    def _forget(self, ask_id: str) -> None:
        self.asking.pop(ask_id, None)
        self.waits.pop(ask_id, None)
        self.said.pop(ask_id, None)

    async def slot(
        self, ask_id: str, message: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        view = view_of(message["view"])
        notice = Notice(self, ask_id) if message.get("notice") else None
        priority = int(message.get("priority") or 0)
        key = message.get("key")
        waited = float(message.get("waited") or 0.0)
        waited = waited if math.isfinite(waited) and waited > 0 else 0.0
        ctl = registry.controller()
        slot: Slot = await registry.acquire_here(
            ctl, view, priority, None if key is None else int(key), notice, waited
        )
        return {"urls": list(slot.urls)}, functools.partial(ctl.release, slot)

    async def place(
        self, ask_id: str, message: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        places = limits()
        ticket = await places.enter(claim_of(message["claim"]))
        return {}, functools.partial(places.leave, ticket)

    async def replica(
        self, ask_id: str, message: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        urls = tuple(str(url) for url in message["urls"])
        hint = message.get("hint")
        deployment = str(message["deployment"])
        try:
            said = Hint.received(hint) if isinstance(hint, dict) else None
        except ValueError as exc:
            raise wire.WireError(str(exc)) from exc
        hints.current.set(as_routed(said, deployment))
        marks = cast("Marks", access.current.get())
        url, pin = await dispatcher.router.take(urls, deployment)
        slot = pin.slot if pin is not None else UNPINNED
        chosen: dict[str, Any] = {"url": url, "routed_by": marks.routed_by}
        if pin is not None:
            chosen.update(slot=pin.slot, cache=pin.cache, blocks=pin.blocks)
            self.spoil[ask_id] = functools.partial(dispatcher.router.spoil, url, slot)
        return chosen, functools.partial(dispatcher.router.give, url, slot)

    async def adapter(
        self, ask_id: str, message: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        route, url = adapter_route(message["route"]), str(message["url"])
        await runtime_adapters.ensure(route, url)
        return {}, functools.partial(runtime_adapters.release, route, url)

    async def rpm(
        self, ask_id: str, message: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        key, limit = rated(message)
        self.owner.counted(key, limit, arrivals := windows.admit(key, limit))
        left = windows.left(key, limit, arrivals)  # for the answer's x-ratelimit-* headers
        return {"remaining": left.remaining, "reset_ms": round(left.reset_s * 1000)}, nothing

    async def status(
        self, ask_id: str, message: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        state = message.get("state")
        deployment_id = int(message["deployment"])
        found = registry.status_here(registry.controller(), deployment_id, state and str(state))
        return found, nothing

    def say_figures(self) -> None:
        for ask_id, status in list(self.waits.items()):
            figures = status.figures()
            if figures != self.said.get(ask_id):
                self.said[ask_id] = figures
                self.send({"id": ask_id, "ev": "figures", "figures": figures})

    def close(self) -> None:
        """The link ended: nothing it asked goes on, nothing it held stays held."""
        for task in self.asking.values():
            task.cancel()
        self.asking.clear()
        for give_back in self.held.values():
            try:
                give_back()
            except Exception:  # the rest are given back all the same
                log.exception("giving back what %s held failed", self.name)
        self.held.clear()
        for ticket in self.metered.values():  # none should be left: ended all the same
            meter.end(ticket)
        self.metered.clear()


class Owner:
    def __init__(self, rebuild_s: float) -> None:
        self.rebuild_s = rebuild_s
        self.rebuilt = asyncio.Event()
        self.gateways: set[Gateway] = set()
        self.greeting = 0  # links that have not proved the key yet
        self.hot: set[int] = set()  # keys near their rate limit: each arrival is asked

    def counted(self, key: int, limit: int, arrivals: int) -> None:
        """A key's window after an arrival: the gateways hear when it comes near its limit
        (they ask for each arrival from then on) and when it is well below again (they
        let arrivals in and tell of them after, without waiting)."""
        if arrivals >= limit * client.HOT_SHARE:
            if key not in self.hot:
                self.hot.add(key)
                self.tell({"ev": "rpm", "hot": [key]})
        elif key in self.hot and arrivals < limit * client.COOL_SHARE:
            self.hot.discard(key)
            self.tell({"ev": "rpm", "cool": [key]})

    def tell(self, message: dict[str, Any]) -> None:
        for gateway in self.gateways:
            gateway.send(message)

    async def run(self, addresses: list[wire.Address], ready: Callable[[], None]) -> None:
        client.owner_here = True  # its own decisions are made here, not asked of itself
        registry.controller()  # made in this loop, with its lease renewer
        with contextlib.suppress(Exception):
            await catalog.warm()  # its state changes wake the waiting requests
        servers = []
        for address in addresses:
            if address.path:
                self.only_owner(address.path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address.path)  # a dead owner's socket
                umask = os.umask(0o177)  # the socket is made 0600, never wider for a moment
                try:
                    server = await asyncio.start_unix_server(
                        self.connected, address.path, limit=wire.MAX_LINE
                    )
                finally:
                    os.umask(umask)
            else:
                server = await asyncio.start_server(
                    self.connected, address.host, address.port, limit=wire.MAX_LINE
                )
            servers.append(server)
        ready()
        asyncio.get_running_loop().call_later(self.rebuild_s, self.rebuilt.set)
        while True:
            await asyncio.sleep(FIGURES_EVERY_S)
            for gateway in list(self.gateways):
                try:
                    gateway.say_figures()
                except Exception:  # one gateway's figures never end the owner
                    log.exception("the figures of %s's waiting requests failed", gateway.name)

    def only_owner(self, path: str) -> None:
        """One owner per socket: a second one (started by hand beside serve's) stops rather
        than take the socket over and grant apart from the first. The lock is held for the
        process's life; the kernel drops it when the process dies."""
        self.lock = open(path + ".lock", "w")  # noqa: SIM115 - held until the process ends
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(f"another scheduler owns {path}") from None

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gateway: Gateway | None = None
        try:
            if self.greeting >= MAX_GREETING:
                return  # a flood of links that never prove anything: refused at once
            self.greeting += 1
            try:
                hello, nonce = await self.hello(reader, writer)
            finally:
                self.greeting -= 1
            if hello is None:
                writer.write(wire.encode({"welcome": False}))
                log.warning("refused a scheduler link that did not prove the site's key")
                return
            gateway = Gateway(self, writer, str(hello.get("gateway", ""))[:80])
            gateway.adopt(list(hello.get("holding") or ()))
            self.gateways.add(gateway)
            said = wire.proof("owner", nonce, str(hello["nonce"]))
            writer.write(wire.encode({"welcome": True, "proof": said}))
            writer.write(wire.encode({"ev": "rpm", "hot": sorted(self.hot)}))
            while (message := await wire.read(reader)) is not None:
                gateway.handle(message)
        except (OSError, TimeoutError, wire.WireError, KeyError, TypeError, ValueError) as exc:
            log.warning("a scheduler link ended: %r", exc)
        finally:
            if gateway is not None:
                self.gateways.discard(gateway)
                gateway.close()
            writer.close()

    async def hello(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[dict[str, Any] | None, str]:
        """The gateway's hello where it proves the site's key (wire.py), else None."""
        nonce = wire.fresh_nonce()
        writer.write(wire.encode({"nonce": nonce}))
        hello = await asyncio.wait_for(wire.read(reader), wire.HANDSHAKE_S)
        if hello is None or hello.get("op") != "hello":
            return None, nonce
        if not wire.proves("gateway", nonce, hello.get("nonce"), hello.get("proof")):
            return None, nonce
        return hello, nonce


def nothing() -> None:
    """What a status question holds."""


def addresses() -> list[wire.Address]:
    """Where this owner listens: MSHIP_SCHEDULER_URL's socket, and MSHIP_SCHEDULER_LISTEN."""
    found = []
    if settings.MSHIP_SCHEDULER_URL:
        found.append(wire.parse(settings.MSHIP_SCHEDULER_URL))
    if settings.MSHIP_SCHEDULER_LISTEN:
        found.append(wire.parse("tcp://" + settings.MSHIP_SCHEDULER_LISTEN))
    return [a for n, a in enumerate(found) if a not in found[:n]]
