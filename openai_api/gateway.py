"""The public OpenAI-compatible gateway: a raw ASGI application for /v1 (and /rerank,
/score), ahead of Django's middleware and URL stack.

A request is authenticated and routed from the in-memory catalog (no query), then handed to
the dispatcher for an engine and to the forwarder for the bytes.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

from common import tracing
from deployments.models import Deployment
from openai_api import key_usage, model_status
from openai_api.auth import Caller, authenticate, last_used
from openai_api.bodies import form_field, json_bytes, json_value, parsed
from openai_api.catalog import Route, Snapshot, catalog
from openai_api.dispatch import dispatcher
from openai_api.endpoints import PUBLIC, UNVERSIONED
from openai_api.engine_dialect import adapter_body, chat_body
from openai_api.errors import GatewayError
from openai_api.exchange import Exchange, asgi
from openai_api.limit_headers import Limits
from openai_api.models import shown_prefix
from openai_api.output_tokens import check_output_tokens
from openai_api.rate_limits import rate_limiter
from openai_api.relay import Traffic, relay
from openai_api.responses import background, compact, conversation_api, input_tokens, store
from openai_api.responses import handler as responses
from openai_api.routing import hints
from openai_api.usage.recording import admit, media_units, most_tokens
from openai_api.usage.stream_usage import with_usage_asked

WARM = "/warm"  # POST /v1/models/{model}/warm
SEQUENCE_NUMBER = re.compile(r"-?[0-9]{1,18}")
COUNT_TOKENS = "responses/input_tokens"  # counted by the engine's tokenizer, in a slot
COMPACT = "responses/compact"  # summarised by the model, in a slot
# POSTs under /v1/responses/ that are no stored response's id, each answered by its module.
RESPONSES_TOOLS = frozenset({COUNT_TOKENS, COMPACT})


async def handle(exchange: Exchange) -> None:
    scope = exchange.scope
    method, path = scope["method"], scope["path"]
    if method == "OPTIONS":
        return await preflight(exchange)
    endpoint = UNVERSIONED.get(path) or (path[4:] if path.startswith("/v1/") else "")
    record = exchange.record
    record.endpoint = endpoint
    snapshot = await catalog.current()
    peer = (scope.get("client") or ("", 0))[0]
    with tracing.span("modelship.auth"):
        caller = authenticate(snapshot, exchange.headers, peer)
        record.identity = caller.identity
        limits = None
        if caller.key is not None:
            record.key = shown_prefix(caller.key.prefix)
            record.key_ref = caller.key
            # Every answer says what the key's limits have left (x-ratelimit-*), errors too.
            limits = Limits(caller.key)
            exchange.answer_headers = limits.headers
            # Every route, before its body is read or parsed: a caller over its rate costs
            # nothing more (conversations and stored responses too).
            limits.rpm = await rate_limiter.check(caller.key)
            last_used.touch(caller.key)
    if endpoint == key_usage.PATH:
        return await key_usage.answer(exchange, caller, limits.rpm if limits else None)
    if endpoint == "models" or endpoint.startswith("models/"):
        wanted = endpoint[len("models/") :]
        if method == "POST" and wanted.endswith(WARM):
            return await warm(exchange, snapshot, caller, wanted[: -len(WARM)])
        # A model named ".../status" keeps its card: only an unknown name is a status.
        if (
            method == "GET"
            and wanted.endswith(model_status.SUFFIX)
            and wanted not in snapshot.routes
        ):
            name = wanted[: -len(model_status.SUFFIX)]
            return await model_status.answer(exchange, route_for(snapshot, caller, name), name)
        if method not in ("GET", "HEAD"):
            raise GatewayError(405, f"{method} is not allowed on {path}.", "method_not_allowed")
        return await models(exchange, snapshot, caller.key, wanted)
    if endpoint == "conversations" or endpoint.startswith("conversations/"):
        parts = [part for part in endpoint.split("/")[1:] if part]
        return await conversation_api.handle(
            exchange, caller.identity, method, parts, query_of(exchange)
        )
    tool = endpoint in RESPONSES_TOOLS
    if endpoint.startswith("responses/") and not tool:
        parts = endpoint.split("/")[1:]
        if parts and parts[0]:
            await check_response_scope(caller, snapshot, parts[0])
        return await stored_response(exchange, caller.identity, method, parts)
    if endpoint not in PUBLIC and not tool:
        raise GatewayError(404, f"Unknown path {path}.", "not_found")
    if method != "POST":
        raise GatewayError(405, f"{method} is not allowed on {path}.", "method_not_allowed")
    body = await exchange.read_body()
    content_type = exchange.headers.get("content-type", "")
    name, streaming, data = await parsed(
        requested_model, content_type, body, heavy=content_type.startswith("multipart/")
    )
    route = route_for(snapshot, caller, name)
    record.model = route.name
    # Its budgets, once it asks a model for something: the most it can spend is held.
    record.reservation = await admit(caller.key, most_tokens(endpoint, route, data, len(body)))
    record.body_bytes, record.streaming = len(body), streaming
    record.images, record.characters = media_units(endpoint, data)
    check_output_tokens(route, data)
    hints.note(route, data, exchange.headers, str(caller.key.id) if caller.key else "")
    previous = (data or {}).get("previous_response_id")
    if (endpoint == "responses" or tool) and isinstance(previous, str):
        await check_response_scope(caller, snapshot, previous)
    if endpoint == COUNT_TOKENS:
        hints.current.set(None)  # counted by the engine's tokenizer: no slot's cache changes
        return await input_tokens.count(exchange, route, caller.identity, data or {})
    if endpoint == COMPACT:
        route = responses_route(snapshot, caller, name)
        return await compact.create(exchange, route, caller.identity, data or {})
    if endpoint == "responses" and "chat/completions" in route.endpoints:
        # Built from the engine's chat completions, for every chat-capable deployment.
        return await responses.create(exchange, route, caller.identity, data or {})
    if endpoint not in route.endpoints:
        raise unsupported(route, name, endpoint)
    sent = data
    if isinstance(data, dict):  # a JSON body (a form's is None), whatever its type says
        # Said the engine's way: its chat's dialect, the adapter a route is.
        chat = endpoint == "chat/completions"
        said = chat_body(route, data) if chat else adapter_body(route, data)
        if said is not data:
            body, sent = await json_bytes(said, len(body)), said
    asked = with_usage_asked(endpoint, streaming, sent)
    if asked is not None:
        body = await json_bytes(asked, len(body))
    traffic = Traffic(route, endpoint, path, body, streaming, data, strip_usage=asked is not None)
    await relay(exchange, traffic, lambda on_queued: dispatcher.slot(route, on_queued))


application = asgi(handle)


def route_for(snapshot: Snapshot, caller: Caller, name: str) -> Route:
    route = snapshot.routes.get(name)
    if route is None or (caller.key is not None and not caller.key.may_use(route)):
        # As if it did not exist: a restricted key learns nothing of other models.
        raise GatewayError(404, f"The model {shown(name)} does not exist.", "model_not_found")
    return route


NAME_LENGTH = Deployment._meta.get_field("name").max_length or 200


def shown(name: str) -> str:
    """A requested name as an error quotes it: never longer than a deployment's name can be
    (a caller's megabyte of name is not echoed back to it)."""
    if len(name) <= NAME_LENGTH:
        return repr(name)
    return f"{name[:NAME_LENGTH]!r}... ({len(name)} characters)"


def responses_route(snapshot: Snapshot, caller: Caller, name: str) -> Route:
    """The model of a Responses request: any the caller may use that serves chat."""
    route = route_for(snapshot, caller, name)
    if "chat/completions" not in route.endpoints:
        raise unsupported(route, name, "responses")
    return route


def unsupported(route: Route, name: str, endpoint: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model {name!r} ({route.loader}, {route.usecase}) does not serve /v1/{endpoint}.",
        "unsupported_endpoint",
    )


async def check_response_scope(caller: Caller, snapshot: Snapshot, response_id: str) -> None:
    """A key restricted to some models cannot read, delete, cancel or continue a stored
    response made with another model (it is not found, as another caller's is)."""
    key = caller.key
    if key is None or not key.allowed_models:
        return
    model = await store.run(store.model_of, caller.identity, response_id)
    route = snapshot.routes.get(model) if model is not None else None
    if route is None or not key.may_use(route):
        raise store.not_found(response_id)


async def stored_response(exchange: Exchange, identity: str, method: str, parts: list[str]) -> None:
    """GET and DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel."""
    response_id, rest = (parts[0], parts[1:]) if parts and parts[0] else ("", [])
    query = query_of(exchange)
    if not response_id or len(rest) > 1:
        raise GatewayError(404, f"Unknown path {exchange.scope['path']}.", "not_found")
    if not rest and method == "GET":
        if query.get("stream") == "true":
            after = query.get("starting_after", "-1")
            if not SEQUENCE_NUMBER.fullmatch(after):
                raise GatewayError(
                    400,
                    "'starting_after' is a sequence number.",
                    "invalid_request",
                    param="starting_after",
                )
            return await background.resume(exchange, identity, response_id, int(after))
        return await responses.retrieve(exchange, identity, response_id)
    if not rest and method == "DELETE":
        await background.drop(identity, response_id)
        return await responses.delete(exchange, identity, response_id)
    if rest == ["input_items"] and method == "GET":
        return await responses.list_input_items(exchange, identity, response_id, query)
    if rest == ["cancel"] and method == "POST":
        cancelled = await background.cancel(identity, response_id)
        return await exchange.json(200, json.dumps(cancelled).encode())
    raise GatewayError(
        405, f"{method} is not allowed on {exchange.scope['path']}.", "method_not_allowed"
    )


def query_of(exchange: Exchange) -> dict[str, str]:
    return dict(parse_qsl(exchange.scope.get("query_string", b"").decode("latin-1")))


def requested_model(content_type: str, body: bytes) -> tuple[str, bool, dict[str, Any] | None]:
    """The model a request names, whether it asks for a stream, and its JSON body."""
    if content_type.startswith("multipart/form-data"):
        model = form_field(content_type, body, "model")
        if model is None or not model.strip():
            raise GatewayError(400, "The form has no 'model' field.", "missing_model")
        return model.strip(), False, None
    data = json_value(body)
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        raise GatewayError(400, "The body must be a JSON object with a 'model'.", "missing_model")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        # As OpenAI answers: "yes" or 1 is no boolean, not a stream asked for.
        raise GatewayError(
            400, "'stream' must be a boolean (true or false).", "invalid_type", param="stream"
        )
    return data["model"], stream is True, data


async def models(exchange: Exchange, snapshot: Snapshot, key: Any, wanted: str) -> None:
    visible = [r for r in snapshot.models if key is None or key.may_use(r)]

    def card(route: Route, served: str) -> dict[str, Any]:
        listed = {
            "id": served,
            "object": "model",
            "created": route.created,
            "owned_by": "modelship",
        }
        base = snapshot.routes.get(route.adapter.base) if route.adapter is not None else None
        if base is not None and (key is None or key.may_use(base)):
            listed["parent"] = base.name  # as vLLM lists a LoRA, to a key that may use it
        return listed

    if wanted:
        route = snapshot.routes.get(wanted)
        if route is None or route not in visible:
            raise GatewayError(404, f"The model {shown(wanted)} does not exist.", "model_not_found")
        body = card(route, wanted)
    else:
        data = [card(r, served) for r in visible for served in (r.name, *r.aliases)]
        body = {"object": "list", "data": data}
    await exchange.json(200, json.dumps(body).encode())


async def warm(exchange: Exchange, snapshot: Snapshot, caller: Caller, name: str) -> None:
    """POST /v1/models/{model}/warm: the model loaded ahead of its first use, for a key that
    may use it. An on-demand model is started as its first request would start it (queued
    for memory, refused as a request would be); the answer comes once it is ready, and its
    idle timer restarts as after a request."""
    route = route_for(snapshot, caller, name)
    exchange.record.model = route.name
    await admit(caller.key)
    async with dispatcher.slot(route):
        pass
    body = {"id": name, "object": "model", "owned_by": "modelship", "status": "ready"}
    await exchange.json(200, json.dumps(body).encode())


async def preflight(exchange: Exchange) -> None:
    if exchange.cors_origin is None:
        raise GatewayError(403, "Cross-origin requests are not allowed here.", "cors_forbidden")
    headers = [
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (
            b"access-control-allow-headers",
            exchange.headers.get(
                "access-control-request-headers", "authorization, content-type"
            ).encode(),
        ),
        (b"access-control-max-age", b"600"),
        (b"x-request-id", exchange.request_id.encode()),
    ]
    await exchange.send({"type": "http.response.start", "status": 204, "headers": headers})
    await exchange.send({"type": "http.response.body", "body": b""})
