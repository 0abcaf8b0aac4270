"""A gateway's link to the site's scheduler (ondemand/scheduler/client.py) against a stand-in
owner that speaks the wire protocol: it proves the key both ways, re-announces what it holds
to a new owner, asks again after an outage instead of failing at once, and answers 503
scheduler_unavailable (retryable) where the address answers without the site's key."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ondemand import registry
from ondemand.scheduler import client as client_module
from ondemand.scheduler import owner as owner_module
from ondemand.scheduler import reservations, wire
from ondemand.scheduler.client import GpuShare, Link, place
from ondemand.scheduler.owner import Gateway, Owner
from openai_api.auth import RateLimiter
from openai_api.concurrency import Claim
from openai_api.errors import GatewayError
from openai_api.forwarder import forwarder
from openai_api.runtime_adapters import RuntimeAdapters
from openai_api.usage.gpu_time import GpuMeter, Work

CLAIM = Claim(1, "model", 1, None, None, 0)


class StandIn:
    """An owner that grants every place, and remembers each hello's holdings."""

    def __init__(self, path: Path, *, honest: bool = True) -> None:
        self.path, self.honest = path, honest
        self.hellos: list[list[dict[str, Any]]] = []
        self.released: list[str] = []
        self.links: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.heard = asyncio.Event()  # set at each hello and release
        self.messages: list[dict[str, Any]] = []  # every one a gateway sent

    async def until(self, done: Any) -> None:
        async with asyncio.timeout(5):
            while not done():
                await self.heard.wait()
                self.heard.clear()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self.serve, str(self.path))

    async def stop(self) -> None:
        """As a killed owner: its socket closes, and every link with it."""
        assert self.server is not None
        self.server.close()
        for writer in self.links:
            writer.close()
        await self.server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.links.append(writer)
        nonce = wire.fresh_nonce()
        writer.write(wire.encode({"nonce": nonce}))
        hello = await wire.read(reader)
        assert hello is not None
        assert wire.proves("gateway", nonce, hello["nonce"], hello["proof"])
        self.hellos.append(hello["holding"])
        self.heard.set()
        said = wire.proof("owner", nonce, hello["nonce"]) if self.honest else "0" * 64
        writer.write(wire.encode({"welcome": True, "proof": said}))
        with contextlib.suppress(ConnectionError):
            while (message := await wire.read(reader)) is not None:
                self.messages.append(message)
                if message["op"] == "place":
                    writer.write(wire.encode({"id": message["id"], "ok": {}}))
                elif message["op"] == "release":
                    self.released.append(message["id"])
                    self.heard.set()
                elif message["op"] == "gpu_end":  # the site's division of its GPU time
                    writer.write(wire.encode({"id": message["id"], "ok": {"spent": 0.25}}))


@pytest.fixture
def socket_path() -> Path:
    return Path(tempfile.mkdtemp(prefix="ms-link-", dir="/tmp")) / "scheduler.sock"


async def test_it_tells_a_new_owner_what_it_holds_and_asks_again_after_an_idle_outage(
    socket_path: Path, settings: Any
) -> None:
    settings.MSHIP_SCHEDULER_WAIT_S = 0.5
    owner = StandIn(socket_path)
    await owner.start()
    link = Link(wire.parse(f"unix:{socket_path}"))
    async with place(link, CLAIM):
        await owner.stop()  # the owner dies while the place is held
        again = StandIn(socket_path)
        await again.start()
        await again.until(lambda: again.hellos)
        # The new owner heard of the place in the link's hello, before any question.
        assert [[item["kind"] for item in hello] for hello in again.hellos] == [["place"]]
        held = again.hellos[0][0]["id"]
    await again.until(lambda: again.released == [held])
    await again.stop()
    await asyncio.sleep(1.0)  # an outage longer than MSHIP_SCHEDULER_WAIT_S, with nothing held
    third = StandIn(socket_path)
    await third.start()
    async with place(link, CLAIM):  # asked again of the next owner, not refused at once
        pass
    assert third.hellos == [[]]
    await third.stop()


async def test_it_refuses_an_address_that_answers_without_the_sites_key(
    socket_path: Path, settings: Any
) -> None:
    settings.MSHIP_SCHEDULER_WAIT_S = 0.3
    impostor = StandIn(socket_path, honest=False)
    await impostor.start()
    link = Link(wire.parse(f"unix:{socket_path}"))
    with pytest.raises(GatewayError) as refused:
        async with place(link, CLAIM):
            pass
    assert (refused.value.status, refused.value.code) == (503, "scheduler_unavailable")
    assert refused.value.headers == {"retry-after": "2"}
    assert impostor.hellos  # it was asked, and its answer was not taken
    await impostor.stop()


async def test_it_says_a_requests_work_and_takes_the_owners_figure(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's end says its work to the owner, which meters it, and takes the owner's
    figure for its log line; where the link is down when it ends, none (the owner charges
    it as the link ends), and a dead owner's silence is waited on no longer than
    GPU_END_S."""
    owner = StandIn(socket_path)
    await owner.start()
    link = Link(wire.parse(f"unix:{socket_path}"))
    share = GpuShare(link, "http://engine", 1.0, (3, 4, "sim"))
    await owner.until(lambda: owner.hellos)
    await asyncio.wait_for(link.up.wait(), 5)
    assert await share.spent(Work(12, 5, 0.5)) == 0.25
    assert owner.messages[-1]["work"] == [12, 5, 0.5]
    # Begun before the link was up: said in its hello, as what it holds.
    began = next(m for m in [*owner.hellos[0], *owner.messages] if "url" in m)
    assert (began["key"], began["team"], began["model"]) == (3, 4, "sim")
    cut = GpuShare(link, "http://engine", 1.0, (3, 4, "sim"))
    await owner.stop()
    monkeypatch.setattr(client_module, "GPU_END_S", 0.2)
    assert await cut.spent(None) is None


class Written:
    """The owner's end of a link: what it said."""

    def __init__(self) -> None:
        self.said: list[dict[str, Any]] = []
        self.heard = asyncio.Event()

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.said.append(json.loads(data))
        self.heard.set()


async def heard(said: Written, done: Any) -> None:
    """Until `done(said.said)` holds: what the owner said on that link."""
    async with asyncio.timeout(5):
        while not done(said.said):
            said.heard.clear()
            await said.heard.wait()


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_divides_a_replicas_gpu_time_among_every_gateways_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two gateways' requests on one GPU: each pays half while both run, the sum is the
    time the GPU served, booked to each request's key. A request the owner adopted from a
    restart is metered from then; one whose gateway dies is ended as its link ends (charged
    its time until then); a request's work weighs its part."""
    clock = Clock()
    books: dict[tuple[int, int, str], float] = {}

    def book(account: tuple[int, int, str], minute: int, seconds: float) -> None:
        books[account] = books.get(account, 0.0) + seconds

    monkeypatch.setattr(owner_module, "meter", GpuMeter(clock, book))
    site = Owner(rebuild_s=0)
    one, two = Written(), Written()
    first = Gateway(site, one, "one")  # type: ignore[arg-type]
    second = Gateway(site, two, "two")  # type: ignore[arg-type]
    said = {"url": "http://engine", "share": 1.0, "team": 0, "model": "sim"}
    first.handle({"op": "gpu", "id": "1", "key": 1, **said})
    clock.now = 2.0
    second.handle({"op": "gpu", "id": "1", "key": 2, **said})
    clock.now = 4.0
    first.handle({"op": "gpu_end", "id": "1"})
    clock.now = 6.0
    second.handle({"op": "gpu_end", "id": "1", "work": "not work"})  # weighs its time
    # Each told what was divided by its end: the first's shared seconds came after.
    assert one.said == [{"id": "1", "ok": {"spent": pytest.approx(2.0)}}]
    assert two.said == [{"id": "1", "ok": {"spent": pytest.approx(3.0)}}]
    assert books == {(1, 0, "sim"): pytest.approx(3.0), (2, 0, "sim"): pytest.approx(3.0)}
    second.adopt([{"kind": "gpu", "id": "2", "key": 2, **said}])
    second.handle({"op": "gpu", "id": "3", "key": 2, **said})
    clock.now = 8.0
    second.handle({"op": "gpu_end", "id": "2", "work": [10, 10, None]})
    second.handle({"op": "gpu_end", "id": "9"})  # never begun here
    assert two.said[-1] == {"id": "9", "ok": {"spent": None}}
    first.handle({"op": "gpu", "id": "4", "key": 1, **said})
    second.close()  # its process died: request 3 no longer shares the GPU
    clock.now = 10.0
    first.handle({"op": "gpu_end", "id": "4"})
    assert sum(books.values()) == pytest.approx(10.0)  # every second the GPU served, once
    # Work that is no work (a number past a float's range) weighs the request's time, and
    # leaves no ticket behind.
    first.handle({"op": "gpu", "id": "7", "key": 1, **said})
    first.handle({"op": "gpu_end", "id": "7", "work": [1, 1, 10**400]})
    assert not owner_module.meter.replicas["http://engine"].running
    with pytest.raises(wire.WireError):
        first.handle({"op": "gpu", "id": "5", "key": -1, **said})
    with pytest.raises(wire.WireError):
        first.handle({"op": "gpu", "id": "6", "key": 1, **{**said, "model": "x" * 201}})


@pytest.mark.parametrize(
    "said",
    [
        {"url": "http://engine", "share": -1},
        {"url": "http://engine", "share": 1e9},
        {"url": "http://engine", "share": True},
        {"url": "http://engine", "share": "1"},
        {"url": 7, "share": 1.0},
        {"url": "x" * 5000, "share": 1.0},
    ],
)
def test_it_refuses_a_gpu_share_out_of_bounds(said: dict[str, Any]) -> None:
    gateway = Gateway(Owner(rebuild_s=0), Written(), "g")  # type: ignore[arg-type]
    with pytest.raises(wire.WireError):
        gateway.handle({"op": "gpu", "id": "1", **said})
    assert not gateway.held and not gateway.metered


async def test_it_tells_every_gateway_when_a_key_nears_its_rate_limit_and_when_it_cools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arrivals let in by the gateways are told of; at half the limit every gateway hears
    the key is hot (they ask for each arrival from then on, and past the limit it is 429);
    once its window is below 40% again, that it is cool."""
    windows = RateLimiter()
    monkeypatch.setattr(owner_module, "windows", windows)
    site = Owner(rebuild_s=0)
    site.rebuilt.set()
    one, two = Written(), Written()
    first = Gateway(site, one, "one")  # type: ignore[arg-type]
    second = Gateway(site, two, "two")  # type: ignore[arg-type]
    site.gateways |= {first, second}
    for n in range(49):
        (first if n % 2 else second).handle({"op": "rpm_note", "key": 7, "limit": 100})
    assert one.said == two.said == []
    first.handle({"op": "rpm_note", "key": 7, "limit": 100})
    assert one.said == two.said == [{"ev": "rpm", "hot": [7]}]
    for n in range(51):
        second.handle({"op": "rpm", "id": str(n), "key": 7, "limit": 100})
    await heard(two, lambda said: len([m for m in said if "id" in m]) == 51)
    answers = [m for m in two.said if "id" in m]
    assert [("ok" in m) for m in answers] == [True] * 50 + [False]
    assert answers[-1]["error"]["status"] == 429
    window = windows.arrivals[7]
    for _ in range(62):
        window.popleft()  # a minute on: 38 arrivals left in the window, 39 with the next
    second.handle({"op": "rpm", "id": "last", "key": 7, "limit": 100})
    await heard(one, lambda said: len(said) == 2)
    assert one.said[-1] == {"ev": "rpm", "cool": [7]}
    first.handle({"op": "rpm_note", "key": 8, "limit": 10**9})  # a key made unlimited
    assert len(windows.arrivals[8]) == 1
    for wrong in ({"key": "7", "limit": 100}, {"key": 7, "limit": 0}, {"key": 7, "limit": 1.5}):
        with pytest.raises(wire.WireError):
            first.handle({"op": "rpm_note", **wrong})


class LoraEngine:
    """A stand-in vLLM engine's adapter endpoints: what it holds, and every unload."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.unloaded: list[str] = []

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": n, "parent": "base", "root": p} for n, p in self.held.items()]
        return web.json_response({"data": [{"id": "base"}, *data]})

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.held[body["lora_name"]] = body["lora_path"]
        return web.Response(text="ok")

    async def unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        self.held.pop(name, None)
        self.unloaded.append(name)
        return web.Response(text="ok")


async def test_it_never_unloads_an_adapter_another_gateway_is_using(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One slot (max_loras 1): gateway one's request uses adapter `a`; gateway two's asks for
    `b` on the same replica: `b` is loaded beside it, `a` is not taken from under the
    request (each process judging by its own requests unloaded it). Once neither is used,
    the least recently used makes room for `c`."""
    engine = LoraEngine()
    app = web.Application()
    app.router.add_get("/v1/models", engine.models)
    app.router.add_post("/v1/load_lora_adapter", engine.load)
    app.router.add_post("/v1/unload_lora_adapter", engine.unload)
    runner = web.AppRunner(app)
    await runner.setup()
    site_ = web.TCPSite(runner, "127.0.0.1", 0)
    await site_.start()
    url = f"http://127.0.0.1:{site_._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    monkeypatch.setattr(owner_module, "runtime_adapters", RuntimeAdapters())
    site = Owner(rebuild_s=0)
    site.rebuilt.set()
    one, two = Written(), Written()
    first = Gateway(site, one, "one")  # type: ignore[arg-type]
    second = Gateway(site, two, "two")  # type: ignore[arg-type]

    def asked(name: str) -> dict[str, Any]:
        adapter = {"base": "base", "runtime": True, "path": f"/loras/{name}", "slots": 1}
        route = {"name": name, "idle_timeout_s": 600, "adapter": adapter}
        return {"op": "adapter", "id": name, "route": route, "url": url}

    async def answered(said: Written, name: str) -> None:
        await heard(said, lambda messages: any(m.get("id") == name for m in messages))

    try:
        first.handle(asked("a"))
        await answered(one, "a")
        second.handle(asked("b"))
        await answered(two, "b")
        assert set(engine.held) == {"a", "b"} and engine.unloaded == []
        first.handle({"op": "release", "id": "a"})
        second.handle({"op": "release", "id": "b"})
        first.handle(asked("c"))
        await answered(one, "c")
        assert "c" in engine.held and engine.unloaded and engine.unloaded[0] in ("a", "b")
    finally:
        await forwarder.retire(set())
        await runner.cleanup()


async def test_it_holds_every_gateways_token_reservations_in_one_place() -> None:
    """Two gateways ask for a key's tokens: the second is refused what the first holds; a
    release, or the first's link ending, gives it back; a malformed ask ends the link."""
    site = Owner(rebuild_s=0)
    site.rebuilt.set()
    one, two = Written(), Written()
    first = Gateway(site, one, "one")  # type: ignore[arg-type]
    second = Gateway(site, two, "two")  # type: ignore[arg-type]
    budget = {
        "kind": "key",
        "ref": "pfx",
        "name": "k",
        "limits": [["tokens_per_day", "day", 100, 10]],
    }

    def reserve(gateway: Gateway, ask_id: str, tokens: int) -> None:
        gateway.handle({"op": "reserve", "id": ask_id, "owners": [budget], "tokens": tokens})

    reserve(first, "a", 60)
    await heard(one, lambda said: any(m.get("id") == "a" for m in said))
    assert "ok" in one.said[-1] and reservations.held == {"pfx": 60}
    reserve(second, "b", 31)  # 10 used + 60 held + 31 > 100
    await heard(two, lambda said: any(m.get("id") == "b" for m in said))
    refused = two.said[-1]["error"]
    assert (refused["status"], refused["code"]) == (429, "budget_exceeded")
    assert "60 of them held" in refused["message"]
    first.handle({"op": "release", "id": "a"})
    assert reservations.held == {}
    reserve(second, "c", 31)
    reserve(first, "d", 20)
    await heard(one, lambda said: any(m.get("id") == "d" for m in said))
    first.close()  # its process went: what it held goes too
    assert reservations.held == {"pfx": 31}
    second.close()
    assert reservations.held == {}
    wrongs: list[dict[str, Any]] = [
        {"tokens": 0},
        {"tokens": 1.5},
        {"owners": []},
        {"owners": [{"kind": "x"}]},
    ]
    for wrong in wrongs:
        with pytest.raises(wire.WireError):
            await reservations.reserve("x", {"owners": [budget], "tokens": 5, **wrong})


async def test_it_meters_a_request_itself_while_its_link_is_not_up(
    socket_path: Path, settings: Any
) -> None:
    """No owner answers yet (or it is away): this process's own meter charges the request,
    never no one; its link starts connecting for the next ones."""
    settings.MSHIP_SCHEDULER_URL = f"unix:{socket_path}"
    assert registry.SiteMeter().begin("http://engine", 1.0, (1, 0, "m")) is None
    to = client_module.link()
    assert to is not None and to.runner is not None and not to.up.is_set()
    to.runner.cancel()
