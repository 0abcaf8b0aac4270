"""A gateway's link to the site's scheduler (ondemand/scheduler/client.py) against a stand-in
owner that speaks the wire protocol: it proves the key both ways, re-announces what it holds
to a new owner, asks again after an outage instead of failing at once, and answers 503
scheduler_unavailable (retryable) where the address answers without the site's key."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ondemand.scheduler import wire
from ondemand.scheduler.client import Link, place
from openai_api.concurrency import Claim
from openai_api.errors import GatewayError

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
                if message["op"] == "place":
                    writer.write(wire.encode({"id": message["id"], "ok": {}}))
                elif message["op"] == "release":
                    self.released.append(message["id"])
                    self.heard.set()


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
