"""/v1/responses: create (streaming and not), retrieve, delete and the input items list.

A create resolves `previous_response_id` from the store first (a store outage is a 503
before any engine work), then takes a slot like any traffic and streams the engine's chat
completion through the translator. The response is stored before its terminal event goes
out; a failed write turns that event into `response.failed`.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError
from openai_api.forwarder import cancel_on_hangup
from openai_api.keepalive import SseOpener, waiting_answer
from openai_api.mcp import loop as mcp_loop
from openai_api.responses import background, protocol, store
from openai_api.responses.engine_turn import conclude
from openai_api.responses.respond import respond
from openai_api.responses.translator import Event, StreamTranslator, sse

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.exchange import Exchange


async def create(exchange: Exchange, route: Route, identity: str, data: dict[str, Any]) -> None:
    request = protocol.parse(data)
    # Refused before anything is written: a model that cannot serve now, a caller over quota.
    dispatcher.check_servable(route)
    if request.store:
        await store.run(store.check_quota, identity, request.background)
    history = await store.earlier_items(identity, request)
    response = protocol.envelope(
        request, protocol.new_id("resp"), int(time.time()), status="in_progress"
    )
    if request.uses_mcp:
        await mcp_loop.check(request, history)
    translator = StreamTranslator(response)
    conversation = [*history, *request.input_items]
    if request.background:
        return await background.start(
            exchange, route, identity, request, translator, history, conversation
        )
    out = HttpOut(exchange, translator, request.stream)

    async def failed(message: str) -> None:
        await out.emit(translator.fail("internal_error", message))
        await out.end()

    exchange.on_failure = failed

    async def save(finished: dict[str, Any]) -> None:
        await store.run(store.save, identity, finished, conversation)

    waiting_answer.set(out.opener)
    async with cancel_on_hangup(exchange.receive):
        await out.emit(translator.start())
        try:
            done = await respond(route, request, history, translator, out.emit, exchange.request_id)
        except GatewayError as exc:
            if not out.opened:
                raise  # nothing went out: a plain error
            # Keepalives opened the stream while it waited: the refusal is its last event.
            await out.emit(translator.fail(exc.code, exc.message))
            done = False
        if done:
            await conclude(translator, out.emit, save if request.store else None)
        elif request.store:  # a failed response can still be retrieved
            with contextlib.suppress(GatewayError):
                await save(translator.response)
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
        self.pending: list[Event] = []  # created/in_progress, held until the engine answers

    @property
    def opened(self) -> bool:
        return self.opener is not None and self.opener.committed

    async def emit(self, events: list[Event]) -> None:
        if self.opener is None or not events:
            return
        if events[0]["type"] == "response.created":
            self.pending = events  # a refusal before anything went out is a plain error
            return
        events, self.pending = [*self.pending, *events], []
        await self.opener.write(b"".join(sse(event) for event in events))

    async def end(self) -> None:
        if self.opener is not None:
            await self.opener.write(b"")
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
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise GatewayError(400, "'order' is asc or desc.", "invalid_request", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise GatewayError(400, "'limit' is 1 to 100.", "invalid_request", param="limit")
    page = await store.run(
        store.input_items, identity, response_id, order, query.get("after"), limit
    )
    await exchange.json(200, json.dumps(page).encode())
