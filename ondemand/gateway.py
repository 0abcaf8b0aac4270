"""The on-demand gateway: /ondemand/{id}/v1/..., the address LiteLLM calls for an on-demand
deployment instead of its engine, as the on-demand seed says.

Checks in the seed's order: the peer guard (middleware), a clean path, a configured key, the
failed-attempt limit, the key, the body size, then the deployment. Traffic takes a slot from
the controller (which may start the model, make room or queue) and goes through the same
forwarder as /v1. Health-check probes are answered here and never reach an engine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings

from common.db_calls import fresh
from deployments.models import State
from ondemand import health_probe
from ondemand.guard import (
    BARE_QUERY,
    FailedAttempts,
    KeyFile,
    check_key,
    checked_segments,
    offered_key,
)
from ondemand.peers import PeerGuard
from ondemand.tasks import enqueue_litellm_sync
from openai_api.bodies import json_bytes, json_value, parsed
from openai_api.catalog import Route, catalog
from openai_api.dispatch import dispatcher
from openai_api.endpoints import ONDEMAND
from openai_api.engine_dialect import adapter_body
from openai_api.errors import GatewayError
from openai_api.exchange import Exchange, asgi
from openai_api.forwarder import Call, cancel_on_hangup, forwarder
from openai_api.relay import Traffic, relay
from openai_api.routing import hints
from openai_api.usage.recording import media_units

UNREACHABLE = "ondemand_upstream_error"

keyfile = KeyFile(lambda: Path(settings.MSHIP_ONDEMAND_KEY_FILE))
failures = FailedAttempts()
keyfile.on_change.append(failures.clear)


def _sync_on_rotation() -> None:
    """A new key is registered with LiteLLM by a sync (queued off the event loop)."""

    asyncio.get_running_loop().run_in_executor(None, fresh, enqueue_litellm_sync)


keyfile.on_change.append(_sync_on_rotation)


def not_found(path: str) -> GatewayError:
    return GatewayError(404, f"Unknown path {path}.", "not_found")


def not_on_demand(route: Route) -> GatewayError:
    return GatewayError(
        503, f"{route.name} is not an on-demand deployment ({route.state}).", "not_on_demand"
    )


async def handle(exchange: Exchange) -> None:
    scope = exchange.scope
    method, path = scope["method"], scope["path"]
    segments = checked_segments(scope.get("raw_path") or path.encode(), bool(scope.get(BARE_QUERY)))
    peer = (scope.get("client") or ("", 0))[0]
    check_key(keyfile, failures, peer, offered_key(exchange.headers))
    if len(segments) < 3 or segments[1] != "v1":
        raise not_found(path)
    endpoint = "/".join(segments[2:])
    exchange.record.endpoint = endpoint
    exchange.record.key = "ondemand"  # the on-demand gateway's one key (LiteLLM's)
    if method == "POST" and endpoint in ONDEMAND:
        kind = "traffic"
    elif method == "GET" and endpoint == "models":
        kind = "models"
    elif method in ("GET", "HEAD") and endpoint.startswith("models/"):
        kind = "model"
    else:
        raise not_found(path)  # the engine's admin and helper endpoints stay unreachable
    body = await exchange.read_body() if kind == "traffic" else b""
    snapshot = await catalog.current()
    # isascii too: isdigit() is true of "²" and other Unicode digits, which int() refuses;
    # 20 digits at most: a bigint's, and int() refuses past 4,300 (a 500).
    ident = segments[0]
    whole = ident.isascii() and ident.isdigit() and len(ident) <= 20
    route = snapshot.by_id(int(ident)) if whole else None
    if route is None:
        raise not_found(path)
    exchange.record.model = route.name
    if route.system:
        raise not_on_demand(route)
    upstream_path = "/v1/" + "/".join(quote(s, safe="-._~:@!$&'()*+,;=") for s in segments[2:])
    if kind == "models":
        return await models(exchange, route)
    if kind == "model":
        return await model(exchange, route, method, upstream_path)
    content_type = exchange.headers.get("content-type", "")
    streaming, data = await parsed(_peek, content_type, body)
    form = content_type.startswith("multipart/form-data")
    reads_any = route.loader == "llama_server" or (route.engine_priority and not form)
    if data is None and reads_any and body.strip():
        # llama.cpp reads any body as JSON: one not read here would pass a `lora` unchecked;
        # so does vLLM, which would take a caller's own `priority` (engine_dialect).
        data = json_value(body)
        data = data if isinstance(data, dict) else None
        if data is None:
            raise GatewayError(400, "The body must be a JSON object.", "invalid_body")
    if isinstance(data, dict) and not content_type.startswith("multipart/form-data"):
        # An adapter of this deployment, by its name (LiteLLM registers each at its base's
        # path); the body says it the engine's way (a caller's own `lora` goes).
        named = snapshot.routes.get(str(data.get("model")))
        if named is not None and named.adapter and named.deployment_id == route.deployment_id:
            route = named
            exchange.record.model = route.name
        if (adapted := adapter_body(route, data)) is not data:
            data, body = adapted, await json_bytes(adapted, len(body))
    if health_probe.asked(exchange.headers):
        return await probe(exchange, route, endpoint, streaming)
    exchange.record.body_bytes, exchange.record.streaming = len(body), streaming
    exchange.record.images, exchange.record.characters = media_units(endpoint, data)
    traffic = Traffic(route, endpoint, upstream_path, body, streaming, data)
    hints.note(route, data, exchange.headers, "ondemand")
    # No keepalives while it waits (for a start, or an always-on adapter's load): a refusal
    # is its HTTP status, and the engine's answers, errors too, pass through unchanged (the
    # seed promises keepalives to nobody here).
    if route.on_demand:
        await relay(
            exchange,
            traffic,
            lambda q: dispatcher.slot(route, q),  # its max_concurrency too
            UNREACHABLE,
            keepalive=False,
            raw_errors=True,
        )
    elif route.state == State.READY and route.urls:
        # Switched to always on while LiteLLM still points here: forwarded, never started.
        held = dispatcher.replica(route.urls, route.name)
        if route.adapter is not None and route.adapter.runtime:
            held = dispatcher.with_adapter(route, held)  # a vLLM adapter: loaded first
        await relay(
            exchange, traffic, lambda _: held, UNREACHABLE, keepalive=False, raw_errors=True
        )
    else:
        raise not_on_demand(route)


application = PeerGuard(asgi(handle, "ondemand"))


def _peek(content_type: str, body: bytes) -> tuple[bool, dict[str, Any] | None]:
    """Whether a JSON body asks for a stream, and the body; the engine judges the rest."""
    if not content_type.startswith("application/json") and not body.startswith(b"{"):
        return False, None
    try:
        data = json_value(body)
    except GatewayError:
        return False, None
    if not isinstance(data, dict):
        return False, None
    return data.get("stream") is True, data


async def models(exchange: Exchange, route: Route) -> None:
    """From the deployment record: never wakes the model."""
    card = {"id": route.name, "object": "model", "created": route.created, "owned_by": "modelship"}
    await exchange.json(200, json.dumps({"object": "list", "data": [card]}).encode())


async def model(exchange: Exchange, route: Route, method: str, upstream_path: str) -> None:
    if route.state != State.READY or not route.urls:
        raise GatewayError(503, f"{route.name} is not ready ({route.state}).", "ondemand_not_ready")
    async with cancel_on_hangup(exchange), dispatcher.replica(route.urls, route.name) as base_url:
        query = exchange.scope.get("query_string", b"").decode("latin-1")
        call = Call(
            method=method,
            url=base_url + upstream_path + (f"?{query}" if query else ""),
            base_url=base_url,
            body=b"",
            headers=exchange.raw_headers,
            request_id=exchange.request_id,
            streaming=False,
            unreachable_code=UNREACHABLE,
            deployment=route.name,
            raw_errors=True,  # the engine's answer as it is, errors too (the seed)
        )
        await forwarder.forward(call, exchange.send)


async def probe(exchange: Exchange, route: Route, endpoint: str, streaming: bool) -> None:
    body, content_type = health_probe.answer(endpoint, route, streaming)
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", exchange.request_id.encode()),
        *((name.encode(), route.state.encode()) for name in health_probe.STATE_HEADERS),
    ]
    await exchange.send({"type": "http.response.start", "status": 200, "headers": headers})
    await exchange.send({"type": "http.response.body", "body": body})
