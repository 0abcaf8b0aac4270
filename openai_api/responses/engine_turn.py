"""One engine turn of a Responses request: the engine's chat completion streamed through the
translator in a slot, and the close of a response (its items, the store, the terminal event).
The MCP loop, background runs and the foreground handler all run turns through here."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import aiohttp

from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError
from openai_api.forwarder import engine_error_of, forwarder, unreachable
from openai_api.keepalive import enter_kept_alive, waiting_answer
from openai_api.responses.translator import Event, StreamTranslator

if TYPE_CHECKING:
    from openai_api.catalog import Route

Emit = Callable[[list[Event]], Awaitable[None]]


async def generate(
    route: Route, body: dict[str, Any], translator: StreamTranslator, emit: Emit, request_id: str
) -> bool:
    """One engine turn through the translator, in a slot; False when the engine failed
    mid-answer (its failure already emitted). Before its answer began, an engine error is
    raised as the request's error."""
    async with AsyncExitStack() as held:
        base_url = await enter_kept_alive(held, dispatcher.slot(route), waiting_answer.get())
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
    """The engine's own refusal (a context-length 400 keeps its message and code); the
    gateway's upstream_error only where the engine gave no code of its own."""
    message, code = await engine_error_of(answer)
    return GatewayError(answer.status, message, code or "upstream_error")
