"""What an engine's answer carries to the caller: its own headers, less the hop-by-hop ones
(those its Connection header names too), its Server and Date, and its request id (the
gateway's goes out instead); and nothing an answer set goes up with the next request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
import pytest
from aiohttp import web

from openai_api.forwarder import Call, Forwarder, downstream_headers
from tests.local_http import local_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Any

ENGINE_HEADERS = {
    "Connection": "keep-alive, X-Engine-Hop",
    "X-Engine-Hop": "1",
    "X-Request-Id": "the-engine-s-own",
    "Server": "engine/1.0",
    "X-Engine-Kept": "yes",
    "Content-Type": "application/json",
}


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    async def answer(_: web.Request) -> web.Response:
        return web.Response(body=b"{}", headers=ENGINE_HEADERS)

    app = web.Application()
    app.router.add_get("/", answer)
    async with local_app(app) as port:
        yield f"http://127.0.0.1:{port}/"


async def test_it_passes_the_engine_s_headers_on_less_hop_by_hop_and_its_own_id(
    engine: str,
) -> None:
    async with aiohttp.ClientSession() as session, session.get(engine) as response:
        headers = downstream_headers(response, "req-1")
    names = [name for name, _ in headers]
    assert all(name == name.lower() for name in names)
    assert (b"x-engine-kept", b"yes") in headers and (
        b"content-type",
        b"application/json",
    ) in headers
    assert {b"connection", b"x-engine-hop", b"server", b"date"}.isdisjoint(names)
    assert [value for name, value in headers if name == b"x-request-id"] == [b"req-1"]


async def test_it_keeps_no_cookie_an_engine_answer_sets() -> None:
    """A cookie from one caller's answer must not reach the engine with another's request."""
    cookies: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("cookie"))
        response = web.Response(body=b"{}", content_type="application/json")
        response.set_cookie("session", "of-the-first-caller")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with local_app(app) as port:
        # A name, not an address: aiohttp keeps no cookie of an IP address anyway.
        base = f"http://localhost:{port}"
        forwarder = Forwarder()
        try:
            for caller in ("first", "second"):
                sent: list[dict[str, Any]] = []

                async def send(message: dict[str, Any], into: list[dict[str, Any]] = sent) -> None:
                    into.append(message)

                call = Call("POST", base + "/v1/chat/completions", base, b"{}", [], caller, False)
                await forwarder.forward(call, send)
                assert sent[0]["status"] == 200
        finally:
            await forwarder.close()
    assert cookies == [None, None]
