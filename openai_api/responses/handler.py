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
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from openai_api.catalog import Route
from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError
from openai_api.exchange import Exchange
from openai_api.forwarder import (
    cancel_on_hangup,
    engine_message,
    forwarder,
    sse_start,
    unreachable,
)
from openai_api.mcp import loop as mcp_loop
from openai_api.responses import protocol, store
from openai_api.responses.translator import Event, StreamTranslator, sse

Emit = Callable[[list[Event]], Awaitable[None]]


async def create(exchange: Exchange, route: Route, identity: str, data: dict[str, Any]) -> None:
    request = protocol.parse(data)
    # Refused before anything is written: a model that cannot serve now, a caller over quota.
    dispatcher.check_servable(route)
    if request.store:
        await store.run(store.check_quota, identity, request.background)
    history: list[dict[str, Any]] = []
    if request.previous_response_id:
        history = await store.run(store.history, identity, request.previous_response_id)
    response = protocol.envelope(
        request, protocol.new_id("resp"), int(time.time()), status="in_progress"
    )
    if request.uses_mcp:
        await mcp_loop.check(request, history)
    translator = StreamTranslator(response)
    conversation = [*history, *request.input_items]
    if request.background:
        from openai_api.responses import background

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

    async with cancel_on_hangup(exchange.receive):
        await out.emit(translator.start())
        if await respond(route, request, history, translator, out.emit, exchange.request_id):
            await conclude(translator, out.emit, save if request.store else None)
        elif request.store:  # a failed response can still be retrieved
            with contextlib.suppress(GatewayError):
                await save(translator.response)
        await out.end()


async def respond(
    route: Route,
    request: protocol.ResponsesRequest,
    history: list[dict[str, Any]],
    translator: StreamTranslator,
    emit: Emit,
    request_id: str,
) -> bool:
    """The response's output: one engine turn, or the MCP loop's many."""
    if request.uses_mcp:
        return await mcp_loop.run(route, request, history, translator, emit, request_id)
    body = protocol.chat_request(request, history)
    return await generate(route, body, translator, emit, request_id)


async def generate(
    route: Route, body: dict[str, Any], translator: StreamTranslator, emit: Emit, request_id: str
) -> bool:
    """One engine turn through the translator, in a slot; False when the engine failed
    mid-answer (its failure already emitted). Before its answer began, an engine error is
    raised as the request's error."""
    async with dispatcher.slot(route) as base_url:
        try:
            await call_engine(base_url, body, translator, emit, request_id, route.name)
        except EngineFailed:
            return False
    return True


async def conclude(
    translator: StreamTranslator,
    emit: Emit,
    save: Callable[[dict[str, Any]], Awaitable[None]] | None,
) -> None:
    """Close the items, store the response, then send its terminal event; a failed write
    turns that event into `response.failed` (the id would not be continuable)."""
    closing = translator.finish()
    terminal = closing.pop()
    await emit(closing)
    if save is not None:
        try:
            await save(translator.response)
        except GatewayError as exc:
            await emit(translator.fail("store_unavailable", exc.message))
            return
    await emit([terminal])


class HttpOut:
    """A foreground create's way out: events as SSE while streaming, else the object."""

    def __init__(self, exchange: Exchange, translator: StreamTranslator, streaming: bool):
        self.exchange = exchange
        self.translator = translator
        self.streaming = streaming
        self.pending: list[Event] = []  # created/in_progress, held until the engine answers
        self.answered = False

    async def emit(self, events: list[Event]) -> None:
        if not self.streaming or not events:
            return
        if events[0]["type"] == "response.created":
            self.pending = events  # a refusal before the engine answers is a plain error
            return
        if not self.answered:
            await self._answer()
            events = [*self.pending, *events]
        body = b"".join(sse(event) for event in events)
        await self.exchange.send({"type": "http.response.body", "body": body, "more_body": True})

    async def _answer(self) -> None:
        self.answered = True
        await self.exchange.send(sse_start(self.exchange.request_id))

    async def end(self) -> None:
        if self.streaming:
            if not self.answered:
                await self._answer()
            await self.exchange.send({"type": "http.response.body", "body": b""})
        else:
            await self.exchange.json(200, json.dumps(self.translator.response).encode())


async def call_engine(
    base_url: str,
    body: dict[str, Any],
    translator: StreamTranslator,
    emit: Emit,
    request_id: str,
    name: str,
) -> None:
    """Stream the engine's chat completion through the translator."""
    url = base_url + "/v1/chat/completions"
    headers = {"content-type": "application/json", "x-request-id": request_id}
    async with forwarder.using(base_url) as session:
        try:
            answer = await session.post(url, json=body, headers=headers)
        except aiohttp.ClientError as exc:
            raise GatewayError(502, unreachable(exc, name), "upstream_error") from exc
        async with answer:
            if answer.status != 200:
                raise await engine_error(answer)
            try:
                async for chunk in chat_chunks(answer):
                    if "error" in chunk:
                        error = chunk["error"] or {}
                        code = str(error.get("code") or "engine_error")
                        message = str(error.get("message") or "the engine failed")
                        await emit(translator.fail(code, message))
                        raise EngineFailed
                    await emit(translator.feed(chunk))
            except aiohttp.ClientError as exc:
                await emit(translator.fail("upstream_error", unreachable(exc, name)))
                raise EngineFailed from exc


class EngineFailed(Exception):
    """The engine failed mid-answer; the failure already went out as events."""


async def chat_chunks(answer: aiohttp.ClientResponse) -> Any:
    """The JSON objects of an SSE chat completion stream, to its [DONE]."""
    async for raw in answer.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        try:
            yield json.loads(payload)
        except ValueError:
            continue


async def engine_error(answer: aiohttp.ClientResponse) -> GatewayError:
    return GatewayError(answer.status, await engine_message(answer), "upstream_error")


async def retrieve(exchange: Exchange, identity: str, response_id: str) -> None:
    from openai_api.responses.background import poll

    response = await store.run(poll, identity, response_id)
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
