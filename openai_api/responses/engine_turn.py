"""One engine turn of a Responses request: the engine's chat completion streamed through the
translator in a slot, and the close of a response (its items, the store, the terminal event).
The MCP loop, background runs and the foreground handler all run turns through here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from django.conf import settings

from common import tracing
from openai_api import access
from openai_api.cache_figures import hides, without_figures
from openai_api.dispatch import dispatcher
from openai_api.engine_dialect import needs_lora, with_lora
from openai_api.errors import GatewayError
from openai_api.forwarder import engine_error_of, forwarder, requested, unreachable
from openai_api.keepalive import enter_kept_alive, waiting_answer
from openai_api.responses.engine_events import EngineEvents
from openai_api.responses.translator import Event, StreamTranslator
from openai_api.routing import hints, slots

if TYPE_CHECKING:
    from openai_api.catalog import Route

Emit = Callable[[list[Event]], Awaitable[None]]


async def generate(
    route: Route, body: dict[str, Any], translator: StreamTranslator, emit: Emit, request_id: str
) -> bool:
    """One engine turn through the translator, in a slot; False when the engine failed
    mid-answer (its failure already emitted). Before its answer began, an engine error is
    raised as the request's error."""
    if (hint := hints.current.get()) is not None:
        # Keyed by the turn as the engine sees it (the stored conversation's history before
        # the new input), and remembered for the response it makes: the next turn names it.
        prefix = hints.scoped(
            hints.normalised(hints.leading_text(body), settings.MSHIP_ROUTING_PREFIX_CHARS),
            hint.tenant,
        )
        also = hints.response_key(hint.owner, str(translator.response.get("id", "")))
        blocks, marks = hints.blocks_of(body, hints.block_scope(route, hint.tenant))
        turn = replace(hint, prefix=prefix or hint.prefix, also=also, blocks=blocks, marks=marks)
        hints.current.set(turn)
    async with AsyncExitStack() as held:
        base_url = await enter_kept_alive(held, dispatcher.slot(route), waiting_answer.get())
        if needs_lora(route):  # its place in the engine it got
            body = with_lora(route, base_url, body)
        pin = slots.pinned.get()
        if pin is not None and pin.slot != slots.UNPINNED:
            body = {**body, "id_slot": pin.slot}
        try:
            await call_engine(
                base_url, body, translator, emit, request_id, route.name, hides(route)
            )
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
    hide_figures: bool = False,
) -> None:
    """Stream the engine's chat completion through the translator, or, for a deployment
    with `responses: engine`, the engine's own Responses events (EngineEvents).
    `hide_figures`: its cache figures are the site's alone (openai_api/cache_figures.py)."""
    record = access.current.get()
    by_engine = isinstance(translator, EngineEvents)
    url = base_url + ("/v1/responses" if by_engine else "/v1/chat/completions")
    headers = {"content-type": "application/json", "x-request-id": request_id}
    async with forwarder.using(base_url) as session:
        tracing.inject(headers)
        try:
            answer = await requested(session, "POST", url, json=body, headers=headers)
        except aiohttp.ClientError as exc:
            raise GatewayError(502, unreachable(exc, name), "upstream_error") from exc
        async with answer:
            if answer.status != 200:
                raise await engine_error(answer)
            try:
                async for data in sse_objects(answer):
                    if hide_figures and (count := without_figures(data)) is not None and record:
                        record.cached_seen = max(record.cached_seen, count)
                    if (failure := failure_of(data)) is not None:
                        await emit(translator.fail(*failure))
                        raise EngineFailed
                    if isinstance(translator, EngineEvents):
                        await emit(translator.relay(data))
                    else:
                        await emit(translator.feed(data))
            except aiohttp.ClientError as exc:
                await emit(translator.fail("upstream_error", unreachable(exc, name)))
                raise EngineFailed from exc
    if isinstance(translator, EngineEvents) and translator.final is None:
        ended = f"The engine of {name} ended its stream before its response was done."
        await emit(translator.fail("upstream_error", ended))
        raise EngineFailed


def failure_of(data: dict[str, Any]) -> tuple[str, str] | None:
    """An error the engine sent inside its stream, as (code, message): a chat chunk's
    `error`, or a Responses `error` event."""
    if data.get("type") == "error":
        error = data
    elif "error" in data and "type" not in data:
        error = data["error"] if isinstance(data["error"], dict) else {}
    else:
        return None
    message = str(error.get("message") or "the engine failed")
    return str(error.get("code") or "engine_error"), message


class EngineFailed(Exception):
    """The engine failed mid-answer; the failure already went out as events."""


async def sse_objects(answer: aiohttp.ClientResponse) -> Any:
    """The JSON objects of an SSE stream (a chat completion's, to its [DONE], or the
    Responses events), each from its `data:` line."""
    async for raw in answer.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        try:
            yield orjson.loads(payload)  # a chunk per token: orjson, for its speed
        except ValueError:
            continue


async def engine_error(answer: aiohttp.ClientResponse) -> GatewayError:
    """The engine's own refusal (a context-length 400 keeps its message and code); the
    gateway's upstream_error only where the engine gave no code of its own."""
    message, code = await engine_error_of(answer)
    return GatewayError(answer.status, message, code or "upstream_error")
