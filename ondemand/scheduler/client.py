"""A gateway process's link to the scheduler's owner: one connection per event loop, over
which every request that needs a decision (an on-demand slot, a max_concurrency place, the
site's on-demand figures) asks, and hears back its grant, its refusal or what it waits for.

Invariants:
- A request whose answer needs no decision never comes here (the dispatcher asks only for
  on-demand deployments and limited requests).
- What this process holds is the owner's to count: each grant is remembered here until it is
  released, and said again to a new owner as this process connects (`hello`), so a restarted
  owner counts the streams still running before it grants anything.
- While the owner is away, requests that wait stay waiting, in their order, and are asked
  again of the next owner; one that cannot reach an owner within MSHIP_SCHEDULER_WAIT_S gets
  a retryable 503 (never a hang). Streams already granted run on: they need nothing of it.
- A request that gives up (its client hung up) says so; a grant that crosses its cancel is
  released at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings

from ondemand.count_sums import PROCESS
from ondemand.scheduler import wire
from openai_api import wait_status
from openai_api.access import mark_waited
from openai_api.errors import GatewayError
from openai_api.runtime_adapters import runtime_adapters

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from openai_api.catalog import Route
    from openai_api.concurrency import Claim
    from openai_api.dispatch import WaitNotice
    from openai_api.usage.gpu_time import Account, Work

log = logging.getLogger(__name__)
RETRY_S = 0.1  # between attempts to reach the owner, doubled up to MAX_RETRY_S
MAX_RETRY_S = 1.0
CONNECT_S = 2.0  # one attempt's bound
GPU_END_S = 2.0  # the owner's figure for a request's GPU time so far (its log line's)
# Rate limits: a key's arrivals are let in here and told of after, without waiting, while
# its window is below HOT_SHARE of its limit (the owner says when it crosses, and when it is
# back below COOL_SHARE); near it, and for a limit of ALWAYS_ASK_RPM or less, each is asked.
HOT_SHARE = 0.5
COOL_SHARE = 0.4
ALWAYS_ASK_RPM = 60


def unavailable(why: str) -> GatewayError:
    return GatewayError(
        503,
        f"The site's scheduler does not answer ({why}); try again shortly.",
        "scheduler_unavailable",
        {"retry-after": "2"},
    )


def refusal(error: dict[str, Any]) -> GatewayError:
    """The owner's refusal as this process raises it (its status, code and Retry-After)."""
    status = error.get("status")
    headers = dict(error.get("headers") or {})
    retry = {"retry-after": str(headers["retry-after"])[:8]} if "retry-after" in headers else {}
    return GatewayError(
        status if isinstance(status, int) and 400 <= status < 600 else 503,
        str(error.get("message", ""))[:2000],
        str(error.get("code", "scheduler_error"))[:64],
        retry,
    )


@dataclass
class Ask:
    """One request's question, waiting for its answer."""

    id: str
    message: dict[str, Any]
    answer: asyncio.Future[dict[str, Any]]
    notice: WaitNotice | None = None
    figures: dict[str, Any] | None = None
    sent: bool = False


@dataclass
class RemoteSlot:
    """An on-demand slot the owner granted: released through the link that holds it."""

    id: str
    deployment_id: int
    urls: tuple[str, ...]
    link: Link = field(repr=False)
    released: bool = False


class Link:
    def __init__(self, address: wire.Address) -> None:
        self.address = address
        self.writer: asyncio.StreamWriter | None = None
        self.asks: dict[str, Ask] = {}  # in the order they were asked
        self.held: dict[str, dict[str, Any]] = {}  # what a new owner is told we hold
        self.ids = itertools.count(1)
        self.down_since: float | None = time.monotonic()
        self.up = asyncio.Event()
        self.runner: asyncio.Task[None] | None = None
        self.hot: set[int] = set()  # keys near their rate limit, as the owner said

    # --- asking ----------------------------------------------------------------------------

    def new_ask(self, message: dict[str, Any], notice: WaitNotice | None = None) -> Ask:
        ask_id = f"{next(self.ids)}"
        future = asyncio.get_running_loop().create_future()
        return Ask(ask_id, {**message, "id": ask_id}, future, notice)

    async def answer(self, ask: Ask) -> dict[str, Any]:
        """Send the question and wait for its answer (raises the owner's refusal)."""
        self._run()
        if self.down_since is not None and not self.up.is_set():
            waited = time.monotonic() - self.down_since
            if waited > settings.MSHIP_SCHEDULER_WAIT_S:
                raise unavailable(f"unreachable for {waited:.0f} s")
        self.asks[ask.id] = ask
        self._send_ask(ask)
        try:
            answer = await ask.answer
        except asyncio.CancelledError:
            self._give_up(ask)
            raise
        finally:
            self.asks.pop(ask.id, None)
        if answer.get("waited"):
            mark_waited(str(answer["waited"]))
        if "error" in answer:
            raise refusal(answer["error"])
        return dict(answer["ok"]) if isinstance(answer["ok"], dict) else {}

    def _send_ask(self, ask: Ask) -> None:
        if self.writer is not None and self.up.is_set():
            self._write(ask.message)
            ask.sent = True

    def _give_up(self, ask: Ask) -> None:
        answer = ask.answer
        granted = answer.done() and not answer.cancelled() and answer.exception() is None
        if granted and "ok" in answer.result():
            self.release(ask.id)  # granted as it was cancelled: give it back
        elif ask.sent:
            self._write({"op": "cancel", "id": ask.id})

    def hold(self, ask: Ask, what: dict[str, Any]) -> None:
        self.held[ask.id] = what

    def release(self, ask_id: str, *, failed: bool = False) -> None:
        self.held.pop(ask_id, None)
        said: dict[str, Any] = {"op": "release", "id": ask_id}
        if failed:  # a pinned slot's request that did not reach its engine, or failed there
            said["failed"] = True
        self._write(said)

    def _write(self, message: dict[str, Any]) -> None:
        if self.writer is None or self.writer.is_closing():
            return  # the next owner hears what is still held in our hello
        self.writer.write(wire.encode(message))

    # --- the connection --------------------------------------------------------------------

    def _run(self) -> None:
        if self.runner is None or self.runner.done():
            self.runner = asyncio.create_task(self._keep_connected())

    async def _keep_connected(self) -> None:
        delay = RETRY_S
        while True:
            try:
                reader, writer = await asyncio.wait_for(wire.open_link(self.address), CONNECT_S)
            except (OSError, TimeoutError) as exc:
                why = repr(exc)
            else:
                try:
                    self.hot.clear()  # the new owner says which keys are near their limit
                    announced = await self._greet(reader, writer)
                    self.writer, self.down_since, delay = writer, None, RETRY_S
                    self.up.set()
                    for gone in announced - self.held.keys():
                        self._write({"op": "release", "id": gone})  # ended as we greeted
                    for ask in list(self.asks.values()):  # in their order, to this owner
                        ask.sent = False
                        self._send_ask(ask)
                    await self._read(reader)
                    why = "the owner closed the link"
                except (OSError, wire.WireError, TimeoutError) as exc:
                    why = repr(exc)
                finally:
                    self.up.clear()
                    self.writer = None
                    writer.close()
            if self.down_since is None:  # said once an outage, not at every try
                log.warning("the link to the scheduler at %s is down: %s", self.address, why)
            self._still_down(why)
            if not self.asks and not self.held:
                # Nobody needs it now: the next question starts it again, and waits for it
                # anew (an outage long over is not held against it).
                self.down_since = None
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> set[str]:
        """Both sides prove the site's key (wire.py); the owner hears what we hold. Returns
        the holdings announced (one released meanwhile is released again once up)."""
        challenge = await asyncio.wait_for(wire.read(reader), wire.HANDSHAKE_S)
        owners = None if challenge is None else challenge.get("nonce")
        if not isinstance(owners, str):
            raise wire.WireError("no challenge from the owner")
        mine = wire.fresh_nonce()
        holding = [{"id": ask_id, **what} for ask_id, what in self.held.items()]
        hello = {"op": "hello", "gateway": PROCESS, "holding": holding, "nonce": mine}
        writer.write(wire.encode({**hello, "proof": wire.proof("gateway", owners, mine)}))
        welcome = await asyncio.wait_for(wire.read(reader), wire.HANDSHAKE_S)
        if welcome is None or welcome.get("welcome") is not True:
            raise wire.WireError(f"the owner refused this gateway: {welcome}")
        if not wire.proves("owner", owners, mine, welcome.get("proof")):
            raise wire.WireError("the scheduler's address answers without the site's key")
        return {str(item["id"]) for item in holding}

    def _still_down(self, why: str) -> None:
        """Asks that waited too long for an owner are answered: retryable, not a hang."""
        if self.down_since is None:
            self.down_since = time.monotonic()
        waited = time.monotonic() - self.down_since
        if waited <= settings.MSHIP_SCHEDULER_WAIT_S:
            return
        for ask in list(self.asks.values()):
            if not ask.answer.done():
                ask.answer.set_exception(unavailable(f"unreachable for {waited:.0f} s: {why}"))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while (message := await wire.read(reader)) is not None:
            event = message.get("ev")
            if event == "rpm" and "id" not in message:
                self.hot |= {k for k in message.get("hot", ()) if type(k) is int}
                self.hot -= {k for k in message.get("cool", ()) if type(k) is int}
                continue
            ask = self.asks.get(str(message.get("id")))
            if ask is None:
                if "ok" in message and event is None:
                    self.release(str(message.get("id")))  # its asker gave up meanwhile
                continue
            if event == "figures":
                ask.figures = message.get("figures")
            elif event == "queued" and ask.notice is not None:
                ask.figures = message.get("figures")
                ask.notice.on_queued(ask.figures)
            elif event == "preparing" and ask.notice is not None:
                ask.notice.on_preparing(str(message.get("doing", "")))
            elif event is None and not ask.answer.done():
                ask.answer.set_result(message)


_links: dict[asyncio.AbstractEventLoop, Link] = {}
# Set in the owner's own process: it decides where gateways ask (never asks itself).
owner_here = False


def link() -> Link | None:
    """This event loop's link to the site's scheduler; None where this process owns it."""
    url = settings.MSHIP_SCHEDULER_URL
    if not url or owner_here:
        return None
    loop = asyncio.get_running_loop()
    found = _links.get(loop)
    if found is None or str(found.address) != str(wire.parse(url)):
        if found is not None and found.runner is not None and not found.held:
            found.runner.cancel()  # the site's scheduler moved: its old address is let go
        found = _links[loop] = Link(wire.parse(url))
        for other in [lp for lp in _links if lp.is_closed()]:
            del _links[other]
    return found


async def slot(
    to: Link,
    view: dict[str, Any],
    priority: int,
    key_id: int | None,
    notice: WaitNotice | None,
    waited_s: float = 0.0,
) -> RemoteSlot:
    """A slot from the owner's controller; `waited_s`: what the request already waited (for a
    max_concurrency place), which the owner counts against its queue timeout."""
    message = {"op": "slot", "view": view, "priority": priority, "key": key_id}
    message["waited"] = waited_s
    message["notice"] = notice is not None
    ask = to.new_ask(message, notice)
    wait_status.follow(lambda: ask.figures)  # a stream's keepalives say what the owner said
    granted = await to.answer(ask)
    urls = tuple(str(url) for url in granted["urls"])
    to.hold(ask, {"kind": "slot", "deployment": view["id"], "urls": list(urls)})
    return RemoteSlot(ask.id, int(view["id"]), urls, to)


@contextlib.asynccontextmanager
async def place(to: Link, claim: Claim) -> AsyncIterator[None]:
    ask = to.new_ask({"op": "place", "claim": asdict(claim)})
    wait_status.follow(lambda: ask.figures)
    await to.answer(ask)
    to.hold(ask, {"kind": "place", "claim": asdict(claim)})
    try:
        yield
    finally:
        to.release(ask.id)


@contextlib.asynccontextmanager
async def adapter(to: Link, route: Route, url: str) -> AsyncIterator[None]:
    """A vLLM adapter loaded into the engine at `url` by the owner, counted in use there
    until the block ends: no process unloads it while any uses it."""
    assert route.adapter is not None
    about = {"name": route.name, "idle_timeout_s": route.idle_timeout_s}
    about["adapter"] = asdict(route.adapter)
    ask = to.new_ask({"op": "adapter", "route": about, "url": url})
    try:
        await to.answer(ask)
    except GatewayError as exc:
        if exc.code != "scheduler_unavailable":
            raise
        # No owner now: loaded by this process's own account, rather than a 503.
        await runtime_adapters.ensure(route, url)
        try:
            yield
        finally:
            runtime_adapters.release(route, url)
        return
    to.hold(ask, {"kind": "adapter", "route": about, "url": url})
    try:
        yield
    finally:
        to.release(ask.id)


class GpuShare:
    """A request on a replica with a GPU share, metered by the owner's one meter, which
    divides the replica's time among the site's requests and books their parts
    (openai_api/usage/gpu_time.py). Its start is said without waiting; its end says the work
    it did and asks what was divided to it so far (its log line's figure), after the
    answer's last byte went out."""

    __slots__ = ("id", "link")

    def __init__(self, to: Link, url: str, share: float, account: Account) -> None:
        self.link, self.id = to, f"{next(to.ids)}"
        key_id, team_id, model = account
        said = {"url": url, "share": share, "key": key_id, "team": team_id, "model": model}
        to.held[self.id] = {"kind": "gpu", **said}
        to._run()
        to._write({"op": "gpu", "id": self.id, **said})

    async def spent(self, work: Work | None) -> float | None:
        to = self.link
        to.held.pop(self.id, None)
        if to.writer is None or not to.up.is_set():
            return None  # the owner ends it as the link ends (charged its time there)
        said = None if work is None else [work.prompt, work.output, work.first_s]
        ask = Ask(
            self.id,
            {"op": "gpu_end", "id": self.id, "work": said},
            asyncio.get_running_loop().create_future(),
        )
        to.asks[self.id] = ask
        to._send_ask(ask)
        try:
            answer = await asyncio.wait_for(asyncio.shield(ask.answer), GPU_END_S)
        except TimeoutError:
            return None
        finally:
            to.asks.pop(self.id, None)
        spent = (answer.get("ok") or {}).get("spent")
        if isinstance(spent, int | float) and not isinstance(spent, bool) and spent >= 0:
            return float(spent)
        return None


async def admitted(to: Link, key_id: int, limit: int) -> tuple[int, float] | None:
    """One arrival of the key in the site's window (429 past its limit): asked where the key
    is near its limit, else let in and told of. Returns what the window has left and the
    seconds until its oldest arrival leaves: the owner's figures where asked; where not, a
    bound (the window was below HOT_SHARE of the limit when the owner last said, and no
    arrival stays longer than a minute). None: the link is not up, this process's own window
    decides."""
    to._run()
    if not to.up.is_set():
        return None
    bound = (int(limit * (1 - HOT_SHARE)), 60.0)
    if limit > ALWAYS_ASK_RPM and key_id not in to.hot:
        to._write({"op": "rpm_note", "key": key_id, "limit": limit})
        return bound
    said = await to.answer(to.new_ask({"op": "rpm", "key": key_id, "limit": limit}))
    remaining, reset_ms = said.get("remaining"), said.get("reset_ms")
    if type(remaining) is not int or type(reset_ms) is not int:
        return bound  # an owner that does not say (an older one)
    return max(0, remaining), max(0, reset_ms) / 1000


async def reserved(to: Link, owners: list[dict[str, Any]], tokens: int) -> str:
    """A token reservation held by the owner for every process (its 429 where it does not
    fit), released by its id. A link still connecting (a worker's first request) is waited
    for, as a slot's ask is; one down for longer than MSHIP_SCHEDULER_WAIT_S is refused by
    `answer` with scheduler_unavailable, and this process's own holds judge (site_or_own).
    Judged here while the link connected, a burst's first requests on each process were let
    in by their process alone: 14 at once where 13 fit, in about one run of four."""
    ask = to.new_ask({"op": "reserve", "owners": owners, "tokens": tokens})
    await to.answer(ask)
    return ask.id


async def status(to: Link, deployment_id: int, state: str) -> dict[str, Any]:
    return await to.answer(
        to.new_ask({"op": "status", "deployment": deployment_id, "state": state})
    )


def ask_blocking(message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """One question on a link of its own, from a thread with no event loop of ours (an /api
    view): connect, prove, ask, close. Raises OSError or WireError where the owner does not
    answer, and the owner's refusal as a GatewayError."""
    address = wire.parse(settings.MSHIP_SCHEDULER_URL)
    if address.path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(address.path)
    else:
        sock = socket.create_connection((address.host, address.port), timeout_s)
    with sock, sock.makefile("rwb") as stream:

        def said() -> dict[str, Any]:
            line = stream.readline(wire.MAX_LINE)
            if not line.endswith(b"\n"):
                raise wire.WireError("the owner ended the link")
            found = json.loads(line)
            if not isinstance(found, dict):
                raise wire.WireError("a message that is not a JSON object")
            return found

        owners, mine = str(said().get("nonce", "")), wire.fresh_nonce()
        hello = {"op": "hello", "gateway": f"{PROCESS}-once", "holding": [], "nonce": mine}
        stream.write(wire.encode({**hello, "proof": wire.proof("gateway", owners, mine)}))
        stream.flush()
        welcome = said()
        if welcome.get("welcome") is not True:
            raise wire.WireError("the owner refused this process")
        if not wire.proves("owner", owners, mine, welcome.get("proof")):
            raise wire.WireError("the scheduler's address answers without the site's key")
        stream.write(wire.encode({**message, "id": "1"}))
        stream.flush()
        while (answer := said()).get("id") != "1" or "ev" in answer:
            continue
    if "error" in answer:
        raise refusal(answer["error"])
    return dict(answer["ok"])
