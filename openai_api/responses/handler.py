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

import aiohttp

from openai_api.catalog import Route
from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError
from openai_api.forwarder import SSE_HEADERS, cancel_on_hangup, forwarder, unreachable
from openai_api.responses import protocol, store
from openai_api.responses.translator import Event, StreamTranslator, sse

if TYPE_CHECKING:
    from openai_api.gateway import Exchange


async def create(exchange: Exchange, route: Route, identity: str, data: dict[str, Any]) -> None:
    request = protocol.parse(data)
    history: list[dict[str, Any]] = []
    if request.previous_response_id:
        history = await store.run(store.history, identity, request.previous_response_id)
    response = protocol.envelope(
        request, protocol.new_id("resp"), int(time.time()), status="in_progress"
    )
    translator = StreamTranslator(response)
    body = protocol.chat_request(request, history)
    conversation = [*history, *request.input_items]
    run = Run(exchange, translator, request.stream)
    async with cancel_on_hangup(exchange.receive), dispatcher.slot(route) as base_url:
        try:
            await run.call_engine(base_url, body)
        except EngineFailed:
            if request.store:  # a failed response can still be retrieved
                with contextlib.suppress(GatewayError):
                    await store.run(store.save, identity, translator.response, conversation)
            return await run.end()
        closing = translator.finish()
        terminal = closing.pop()
        await run.emit(closing)
        if request.store:
            try:
                await store.run(store.save, identity, translator.response, conversation)
            except GatewayError as exc:
                # Not continuable: reporting success would hand out an id that 404s.
                await run.emit(translator.fail("store_unavailable", exc.message))
                return await run.end()
        await run.emit([terminal])
        await run.end()


class Run:
    """One create's way out: events as SSE while streaming, else the final object."""

    def __init__(self, exchange: Exchange, translator: StreamTranslator, streaming: bool):
        self.exchange = exchange
        self.translator = translator
        self.streaming = streaming
        self.started = False

    async def emit(self, events: list[Event]) -> None:
        if not self.streaming or not events:
            return
        if not self.started:
            self.started = True
            headers = [*SSE_HEADERS, (b"x-request-id", self.exchange.request_id.encode())]
            await self.exchange.send(
                {"type": "http.response.start", "status": 200, "headers": headers}
            )
        body = b"".join(sse(event) for event in events)
        await self.exchange.send({"type": "http.response.body", "body": body, "more_body": True})

    async def end(self) -> None:
        if self.streaming:
            await self.exchange.send({"type": "http.response.body", "body": b""})
        else:
            await self.exchange.json(200, json.dumps(self.translator.response).encode())

    async def call_engine(self, base_url: str, body: dict[str, Any]) -> None:
        """Stream the engine's chat completion through the translator. Before its answer
        began an engine error is the request's error; after, it fails the response."""
        url = base_url + "/v1/chat/completions"
        headers = {"content-type": "application/json", "x-request-id": self.exchange.request_id}
        async with forwarder.using(base_url) as session:
            try:
                answer = await session.post(url, json=body, headers=headers)
            except aiohttp.ClientError as exc:
                raise GatewayError(502, unreachable(exc), "upstream_error") from exc
            async with answer:
                if answer.status != 200:
                    raise await engine_error(answer)
                await self.emit(self.translator.start())
                try:
                    async for chunk in chat_chunks(answer):
                        if "error" in chunk:
                            error = chunk["error"] or {}
                            await self.emit(
                                self.translator.fail(
                                    str(error.get("code") or "engine_error"),
                                    str(error.get("message") or "the engine failed"),
                                )
                            )
                            raise EngineFailed
                        await self.emit(self.translator.feed(chunk))
                except aiohttp.ClientError as exc:
                    await self.emit(self.translator.fail("upstream_error", unreachable(exc)))
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
    raw = await answer.read()
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode(errors="replace")[:500] or f"the engine answered {answer.status}"
    return GatewayError(answer.status, str(message), "upstream_error")


async def retrieve(exchange: Exchange, identity: str, response_id: str) -> None:
    stored = await store.run(store.get, identity, response_id)
    await exchange.json(200, json.dumps(stored.response).encode())


async def retrieve_only(identity: str, response_id: str) -> None:
    """404 unless the caller has this response."""
    await store.run(store.get, identity, response_id)


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
