"""One traffic request from a checked route to its engine and back, shared by /v1 and
/ondemand: a slot (which may start the model or queue for memory), the queued notice where
the client can take one, the forwarder, and a hang-up watcher over all of it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common import metrics
from openai_api.bodies import json_bytes
from openai_api.cache_figures import FigureHider, hides
from openai_api.catalog import Route, catalog
from openai_api.engine_dialect import needs_lora, with_lora, with_slot
from openai_api.errors import GatewayError
from openai_api.forwarder import Call, cancel_on_hangup, forwarder, send_sse_error
from openai_api.keepalive import SseOpener, enter_kept_alive
from openai_api.queued_notice import QueuedNotice
from openai_api.queued_notice import eligible as notice_eligible
from openai_api.routing import slots
from openai_api.usage.stream_usage import UsageStripper

if TYPE_CHECKING:
    from openai_api.exchange import Exchange

SlotFactory = Callable[[QueuedNotice | None], AbstractAsyncContextManager[str]]


@dataclass(frozen=True)
class Traffic:
    """A checked traffic request: where it goes on the engine and what it carries."""

    route: Route
    endpoint: str  # e.g. "chat/completions"
    upstream_path: str  # e.g. "/v1/chat/completions"
    body: bytes
    streaming: bool
    data: dict[str, Any] | None
    # The gateway asked the engine for a stream's usage the client did not ask for: its
    # usage event is taken out of the answer (openai_api/usage/stream_usage.py).
    strip_usage: bool = False


async def relay(
    exchange: Exchange,
    traffic: Traffic,
    slot: SlotFactory,
    unreachable_code: str = "upstream_error",
    *,
    keepalive: bool = True,
    raw_errors: bool = False,
) -> None:
    """`keepalive`: SSE comments while a stream waits for its slot (/v1). Without (the
    on-demand gateway, LiteLLM's way in, as its seed says), a stream that waits for a start
    gets nothing until the engine answers, so that a refusal is its HTTP status; only the
    queued notice, where one is due, opens the stream early. `raw_errors`: the engine's
    4xx/5xx answers pass through unchanged (the on-demand gateway; forwarder.Call)."""
    route = traffic.route
    query = exchange.scope.get("query_string", b"").decode("latin-1")
    opener = SseOpener(exchange.send, exchange.request_id) if traffic.streaming else None
    notice = None
    if route.on_demand and notice_eligible(traffic.endpoint, traffic.data, traffic.streaming):
        notice = QueuedNotice(
            opener, traffic.endpoint, route.name, traffic.streaming, tells_preparing=keepalive
        )
    try:
        async with cancel_on_hangup(exchange), AsyncExitStack() as held:
            # Keepalives while Modelship waits for the slot (a cold start, the queue), not
            # once the engine is called.
            wanted = slot(notice)
            base_url = await enter_kept_alive(held, wanted, opener if keepalive else None)
            if notice is not None:
                await notice.sent()  # the notice goes out before any byte of the engine's
            body = traffic.body
            if needs_lora(route):  # its place in the engine it got (engine_dialect.with_lora)
                said = with_lora(route, base_url, json.loads(body))
                body = await json_bytes(said, len(body))
            pin = slots.pinned.get()
            if pin is not None and pin.slot != slots.UNPINNED:
                body = with_slot(body, pin.slot)
            call = Call(
                method="POST",
                url=base_url + traffic.upstream_path + (f"?{query}" if query else ""),
                base_url=base_url,
                body=body,
                headers=exchange.raw_headers,
                request_id=exchange.request_id,
                streaming=traffic.streaming,
                committed=opener is not None and opener.committed,
                transform=notice.transform() if notice is not None else None,
                unreachable_code=unreachable_code,
                deployment=route.name,
                raw_errors=raw_errors,
            )
            inflight = metrics.inflight_of(route.name)
            inflight.inc()
            metrics.last_request_at[route.name] = time.time()
            try:
                send = exchange.send
                if hides(route, traffic.endpoint):
                    send = FigureHider(send, exchange.record, traffic.streaming)
                if traffic.strip_usage:
                    send = UsageStripper(send, exchange.record)
                await forwarder.forward(call, send)
            finally:
                inflight.dec()
    except GatewayError as exc:
        if notice is not None:
            await notice.sent()
        if opener is None or not opener.committed:
            raise
        # Keepalives or the notice already opened the stream: the error is its last event.
        await send_sse_error(exchange.send, exc.status, exc.message, exc.code)


def _retire_replaced_engines() -> None:
    """A route table that changed may have moved an engine: its old session goes."""
    snapshot = catalog.snapshot
    if snapshot is not None:
        live = {url for route in snapshot.models for url in route.urls}
        _retiring.add(asyncio.ensure_future(forwarder.retire(live)))
        for task in [t for t in _retiring if t.done()]:
            _retiring.discard(task)


_retiring: set[asyncio.Future[None]] = set()
catalog.listeners.append(_retire_replaced_engines)
