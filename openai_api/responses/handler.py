"""/v1/responses over HTTP: create (streaming and not), retrieve, delete and the input
items list.

A create resolves what it continues from (`previous_response_id`, `conversation`) first (a
store outage is a 503 before any engine work), then takes a slot like any traffic and
streams the engine's chat completion through the translator. The response is stored before
its terminal event goes out; a failed write turns that event into `response.failed`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from openai_api.forwarder import cancel_on_hangup
from openai_api.keepalive import SseOpener
from openai_api.responses import background, fields, store
from openai_api.responses.foreground import Opening, run
from openai_api.responses.translator import DONE, Event, StreamTranslator, sse
from openai_api.responses.turn import prepare

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.exchange import Exchange


async def create(exchange: Exchange, route: Route, identity: str, data: dict[str, Any]) -> None:
    turn = await prepare(route, identity, data)
    if turn.request.background:
        return await background.start(exchange, turn)
    out = HttpOut(exchange, turn.translator, turn.request.stream)

    async def failed(message: str) -> None:
        await out.emit(turn.translator.fail("internal_error", message))
        await out.end()

    exchange.on_failure = failed
    async with cancel_on_hangup(exchange):
        await run(turn, out, exchange.request_id)
        await out.end()


class HttpOut:
    """A foreground create's way out: events as SSE while streaming, else the object."""

    def __init__(self, exchange: Exchange, translator: StreamTranslator, streaming: bool):
        self.exchange = exchange
        self.translator = translator
        self.streaming = streaming
        # The SSE answer, opened by the first events or by a keepalive while the request
        # waits for its slot.
        self.opener = SseOpener(exchange.send, exchange.request_id) if streaming else None
        self.opening = Opening()

    @property
    def opened(self) -> bool:
        return self.opener is not None and self.opener.committed

    async def emit(self, events: list[Event]) -> None:
        if self.opener is None or not (events := self.opening.release(events)):
            return
        await self.opener.write(b"".join(sse(event) for event in events))

    async def end(self) -> None:
        if self.opener is not None:
            await self.opener.write(DONE)
            await self.exchange.send({"type": "http.response.body", "body": b""})
        else:
            await self.exchange.json(200, json.dumps(self.translator.response).encode())


async def retrieve(exchange: Exchange, identity: str, response_id: str) -> None:
    response = await store.run(background.poll, identity, response_id)
    await exchange.json(200, json.dumps(response).encode())


async def delete(exchange: Exchange, identity: str, response_id: str) -> None:
    await store.run(store.delete, identity, response_id)
    body = {"id": response_id, "object": "response", "deleted": True}
    await exchange.json(200, json.dumps(body).encode())


async def list_input_items(
    exchange: Exchange, identity: str, response_id: str, query: dict[str, str]
) -> None:
    order, after, limit = fields.page_of(query)
    page = await store.run(store.input_items, identity, response_id, order, after, limit)
    await exchange.json(200, json.dumps(page).encode())
