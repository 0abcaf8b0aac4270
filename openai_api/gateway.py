"""The public OpenAI-compatible gateway: a raw ASGI application for /v1 (and /rerank,
/score), ahead of Django's middleware and URL stack.

A request is authenticated and routed from the in-memory catalog (no query), then handed to
the dispatcher for an engine and to the forwarder for the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from modelship_site.request_id import make_request_id
from openai_api.auth import Caller, authenticate, last_used, rate_limiter
from openai_api.bodies import form_field, json_value
from openai_api.catalog import Route, Snapshot, catalog
from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError, error_body
from openai_api.forwarder import send_sse_error
from openai_api.relay import Traffic, relay
from openai_api.responses import background, store
from openai_api.responses import handler as responses

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# The inference endpoints, as paths under /v1.
TRAFFIC = frozenset(
    {
        "chat/completions",
        "completions",
        "embeddings",
        "messages",
        "responses",
        "audio/transcriptions",
        "audio/translations",
        "audio/speech",
        "images/generations",
        "images/edits",
        "rerank",
        "score",
    }
)
UNVERSIONED = {"/rerank": "rerank", "/score": "score"}
INLINE_PARSE_BYTES = 256 * 1024  # parsed on the event loop up to this size
SEQUENCE_NUMBER = re.compile(r"-?[0-9]{1,18}")


class ClientGone(Exception):
    pass


class Exchange:
    """One request's plumbing: its headers, its id, and whether its answer has started."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.raw_headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.raw_headers
        }
        self.request_id = make_request_id(self.headers.get("x-request-id"))
        self.started = False
        self.finished = False
        self.body_read = False
        self.sse = False
        # How an answer already under way ends when something unexpected breaks it (the
        # Responses API ends with response.failed); None: the plain SSE error event.
        self.on_failure: Callable[[str], Awaitable[None]] | None = None
        origin = self.headers.get("origin")
        allowed = settings.MSHIP_CORS_ORIGINS
        self.cors_origin = origin if origin and ("*" in allowed or origin in allowed) else None

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.sse = (b"content-type", b"text/event-stream") in message.get("headers", [])
            if self.cors_origin:
                message = {
                    **message,
                    "headers": [*message.get("headers", []), *self.cors_headers()],
                }
        elif not message.get("more_body"):
            self.finished = True
        await self._send(message)

    def cors_headers(self) -> list[tuple[bytes, bytes]]:
        assert self.cors_origin is not None
        return [
            (b"access-control-allow-origin", self.cors_origin.encode()),
            (b"access-control-expose-headers", b"x-request-id, retry-after"),
            (b"vary", b"origin"),
        ]

    @property
    def has_unread_body(self) -> bool:
        declared = self.headers.get("content-length", "0")
        has_body = "transfer-encoding" in self.headers or (declared != "0" and declared != "")
        return has_body and not self.body_read

    async def json(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", self.request_id.encode()),
            *[(k.encode(), v.encode()) for k, v in (extra or {}).items()],
        ]
        if self.has_unread_body:
            # Refused before its body was read (or read whole): the connection closes rather
            # than take in the rest of an upload nobody will use.
            headers.append((b"connection", b"close"))
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def fail(self) -> None:
        """Answer an unexpected error: a JSON 500 while nothing went out, else an error
        event (an SSE answer) and the end of the answer. The details stay in the log."""
        message = f"The server had an error processing the request {self.request_id}."
        if not self.started:
            await self.json(500, error_body(500, message, "internal_error"))
        elif not self.finished:
            if self.on_failure is not None:
                await self.on_failure(message)
            elif self.sse:
                await send_sse_error(self.send, 500, message, "internal_error")
            else:
                await self.send({"type": "http.response.body", "body": b""})

    async def read_body(self) -> bytes:
        limit = settings.MSHIP_MAX_BODY_BYTES
        too_large = GatewayError(
            413, f"The request body is larger than {limit} bytes.", "request_too_large"
        )
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        idle = settings.MSHIP_BODY_IDLE_TIMEOUT_S
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(idle) as deadline:
                while True:
                    message = await self.receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise too_large
                    chunks.append(chunk)
                    if not message.get("more_body"):
                        self.body_read = True
                        return b"".join(chunks)
                    deadline.reschedule(loop.time() + idle)  # a trickle, not a stall
        except TimeoutError as exc:
            raise GatewayError(
                408, f"The request body stalled for {idle:g} s.", "request_timeout"
            ) from exc


def asgi(handler: Callable[[Exchange], Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """An ASGI application of a handler: its errors answered OpenAI-style while nothing of
    the answer went out yet, a caller's hang-up ending it quietly."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(scope, receive, send)
        try:
            await handler(exchange)
        except GatewayError as exc:
            if not exchange.started:
                await exchange.json(exc.status, exc.body(), exc.headers)
        except ClientGone:
            pass
        except Exception:
            log.exception(
                "%s %s failed (request %s)",
                scope.get("method"),
                scope.get("path"),
                exchange.request_id,
            )
            with contextlib.suppress(Exception):  # the caller may be gone too
                await exchange.fail()

    return application


async def handle(exchange: Exchange) -> None:
    scope = exchange.scope
    method, path = scope["method"], scope["path"]
    if method == "OPTIONS":
        return await preflight(exchange)
    endpoint = UNVERSIONED.get(path) or (path[4:] if path.startswith("/v1/") else "")
    snapshot = await catalog.current()
    peer = (scope.get("client") or ("", 0))[0]
    caller = authenticate(snapshot, exchange.headers, peer)
    if endpoint == "models" or endpoint.startswith("models/"):
        if method not in ("GET", "HEAD"):
            raise GatewayError(405, f"{method} is not allowed on {path}.", "method_not_allowed")
        return await models(exchange, snapshot, caller.key, endpoint[len("models/") :])
    if endpoint.startswith("responses/"):
        parts = endpoint.split("/")[1:]
        if parts and parts[0]:
            await check_response_scope(caller, snapshot, parts[0])
        return await stored_response(exchange, caller.identity, method, parts)
    if endpoint not in TRAFFIC:
        raise GatewayError(404, f"Unknown path {path}.", "not_found")
    if method != "POST":
        raise GatewayError(405, f"{method} is not allowed on {path}.", "method_not_allowed")
    if caller.key is not None:
        # Before the body is read or parsed: a caller over its rate costs nothing more.
        rate_limiter.check(caller.key)
        last_used.touch(caller.key)
    body = await exchange.read_body()
    content_type = exchange.headers.get("content-type", "")
    if len(body) > INLINE_PARSE_BYTES or content_type.startswith("multipart/"):
        # A big or multipart body is parsed in a thread: other streams keep flowing.
        name, streaming, data = await asyncio.to_thread(requested_model, content_type, body)
    else:
        name, streaming, data = requested_model(content_type, body)
    route = snapshot.routes.get(name)
    if route is None or (caller.key is not None and not caller.key.may_use(route)):
        # As if it did not exist: a restricted key learns nothing of other models.
        raise GatewayError(404, f"The model {name!r} does not exist.", "model_not_found")
    previous = (data or {}).get("previous_response_id")
    if endpoint == "responses" and isinstance(previous, str):
        await check_response_scope(caller, snapshot, previous)
    if endpoint == "responses" and "chat/completions" in route.endpoints:
        # Built from the engine's chat completions, for every chat-capable deployment.
        return await responses.create(exchange, route, caller.identity, data or {})
    if endpoint not in route.endpoints:
        raise GatewayError(
            404,
            f"The model {name!r} ({route.loader}, {route.usecase}) does not serve /v1/{endpoint}.",
            "unsupported_endpoint",
        )
    traffic = Traffic(route, endpoint, path, body, streaming, data)
    await relay(exchange, traffic, lambda on_queued: dispatcher.slot(route, on_queued))


application = asgi(handle)


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
    query = dict(parse_qsl(exchange.scope.get("query_string", b"").decode("latin-1")))
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
    stream = data.get("stream") is True
    return data["model"], stream, data


async def models(exchange: Exchange, snapshot: Snapshot, key: Any, wanted: str) -> None:
    visible = [r for r in snapshot.models if key is None or key.may_use(r)]

    def card(route: Route, served: str) -> dict[str, Any]:
        return {"id": served, "object": "model", "created": route.created, "owned_by": "modelship"}

    if wanted:
        route = snapshot.routes.get(wanted)
        if route is None or route not in visible:
            raise GatewayError(404, f"The model {wanted!r} does not exist.", "model_not_found")
        body = card(route, wanted)
    else:
        data = [card(r, served) for r in visible for served in (r.name, *r.aliases)]
        body = {"object": "list", "data": data}
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
