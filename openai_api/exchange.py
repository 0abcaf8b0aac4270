"""One request at the gateway's ASGI edge, shared by /v1 and /ondemand: its headers and
request id, reading its body within the limits, answering JSON, and the wrapper that turns
any failure into an OpenAI-shaped answer (a JSON error before the answer starts, an error
event after it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from common import tracing
from common.request_id import make_request_id
from openai_api import access, limit_headers
from openai_api.errors import GatewayError, error_body
from openai_api.forwarder import send_sse_error
from openai_api.sweeps import Sweep, quarter

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class ClientGone(Exception):
    pass


def cors_allowed(origin: str) -> bool:
    """Whether a browser page of this origin may call the gateway (MSHIP_CORS_ORIGINS)."""
    allowed = settings.MSHIP_CORS_ORIGINS
    return "*" in allowed or origin in allowed


def json_headers(body: bytes, request_id: str, extra: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The headers of a JSON answer (an HTTP one, or a refused WebSocket handshake's)."""
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
        *[(k.encode(), v.encode()) for k, v in extra.items()],
    ]


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
        # Told when the answer starts as a stream (the hang-up watch starts then).
        self.on_stream: Callable[[], None] | None = None
        # Headers every answer of the request carries, errors too, worked out as it starts
        # (a key's x-ratelimit-* headers: openai_api/limit_headers.py).
        self.answer_headers: Callable[[], list[tuple[bytes, bytes]]] | None = None
        origin = self.headers.get("origin")
        self.cors_origin = origin if origin and cors_allowed(origin) else None
        self.record = access.RequestRecord(
            scope.get("method", ""), scope.get("path", ""), self.request_id
        )

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.record.status = message["status"]
            # An engine's own type may carry a charset (vLLM: text/event-stream; charset=utf-8).
            self.sse = any(
                name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                for name, value in message.get("headers", [])
            )
            if self.sse and self.on_stream is not None:
                self.on_stream()
            extra = self.cors_headers() if self.cors_origin else []
            if self.record.routed_by:
                extra += routing_headers(self.record.replica, self.record.routed_by)
            if self.record.cache and settings.MSHIP_CACHE_FIGURES != "none":
                extra.append((b"x-modelship-cache", self.record.cache.encode()))
            if self.answer_headers is not None:
                extra += self.answer_headers()
            if extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
        else:
            self.record.sent(message.get("body", b""))
            if not message.get("more_body"):
                self.finished = True
        await self._send(message)

    def cors_headers(self) -> list[tuple[bytes, bytes]]:
        assert self.cors_origin is not None
        return [
            (b"access-control-allow-origin", self.cors_origin.encode()),
            (b"access-control-expose-headers", EXPOSED),
            (b"vary", b"origin"),
        ]

    @property
    def has_unread_body(self) -> bool:
        declared = self.headers.get("content-length", "0")
        has_body = "transfer-encoding" in self.headers or (declared != "0" and declared != "")
        return has_body and not self.body_read

    async def json(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        headers = json_headers(body, self.request_id, extra or {})
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
        if (
            declared.isascii()
            and declared.isdigit()
            and (len(declared) > 20 or int(declared) > limit)
        ):
            raise too_large
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        watch = BodyDeadline.for_body(loop)
        sweep = body_sweep(loop)
        sweep.add(watch)
        try:
            while True:
                watch.waiting = True
                message = await self.receive()
                watch.waiting = False
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
                watch.last = loop.time()  # a trickle, not a stall
        except asyncio.CancelledError as exc:
            if not watch.expired:
                raise
            watch.task.uncancel()
            raise GatewayError(408, watch.reason(), "request_timeout") from exc
        finally:
            sweep.discard(watch)


class BodyDeadline:
    """A body read's deadlines: the reading task is cancelled when it waited `timeout`
    seconds for the next chunk, or when the whole body is not in by `deadline` however
    steadily it trickles (`expired` tells the reader which: "idle" or "total")."""

    __slots__ = ("deadline", "expired", "last", "task", "timeout", "total", "waiting")

    def __init__(self, timeout: float, now: float, total: float = math.inf) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.timeout = timeout
        self.total = total
        self.last = now
        self.deadline = now + total
        self.expired = ""
        # Set only around the read's own await: the cancellation lands there, in the
        # reader's hands, never at a later await of the task.
        self.waiting = False

    @classmethod
    def for_body(cls, loop: asyncio.AbstractEventLoop) -> BodyDeadline:
        """The site's deadlines for a body read starting now."""
        return cls(
            settings.MSHIP_BODY_IDLE_TIMEOUT_S, loop.time(), settings.MSHIP_BODY_TOTAL_TIMEOUT_S
        )

    def sweep(self, now: float) -> bool:
        if not self.waiting:
            return False  # between chunks the reader is busy: looked at again next sweep
        if now >= self.deadline:
            self.expired = "total"
        elif now - self.last >= self.timeout:
            self.expired = "idle"
        else:
            return False
        self.task.cancel()
        return True

    def reason(self) -> str:
        if self.expired == "total":
            return f"The request body was not in within {self.total:g} s."
        return f"The request body stalled for {self.timeout:g} s."


def body_sweep(loop: asyncio.AbstractEventLoop) -> Sweep:
    """The one sweep of this loop's body deadlines, at a quarter of the shorter one."""
    return Sweep.of(
        loop,
        "body",
        lambda: quarter(
            min(settings.MSHIP_BODY_IDLE_TIMEOUT_S, settings.MSHIP_BODY_TOTAL_TIMEOUT_S)
        ),
    )


def asgi(
    handler: Callable[[Exchange], Awaitable[None]], gateway: str = "v1"
) -> Callable[..., Awaitable[None]]:
    """An ASGI application of a handler: its errors answered OpenAI-style while nothing of
    the answer went out yet, a caller's hang-up ending it quietly; its access log line and
    metrics written once it ends."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(scope, receive, send)
        if tracing.ENABLED:
            name = f"{scope.get('method', '')} {scope.get('path', '')}"
            with tracing.server_span(name, exchange.headers) as span:
                await served(exchange, span)
        else:
            await served(exchange, None)

    async def served(exchange: Exchange, span: Any) -> None:
        scope = exchange.scope
        exchange.record.gateway = gateway
        if span is not None:
            exchange.record.trace_id = tracing.trace_id_of(span)
        token = access.current.set(exchange.record)
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
        finally:
            access.current.reset(token)
            try:
                access.finish(exchange.record)
                if span is not None:
                    traced(span, exchange.record)
            except Exception:  # accounting never fails a request
                log.exception("could not record request %s", exchange.request_id)

    return application


def traced(span: Any, record: access.RequestRecord) -> None:
    """What the request's span says of it once it ended: its answer and what it used (and
    its name without a stored response's id, which would make every name its own)."""
    if record.endpoint:  # /v1/... or /ondemand/... (its deployment's id left out)
        span.update_name(
            tracing.bounded(
                f"{record.method} /{record.gateway}/{access.endpoint_label(record.endpoint)}"
            )
        )
    span.set_attribute("http.response.status_code", record.status or access.CLIENT_GONE)
    span.set_attribute("modelship.request_id", record.request_id)
    for name, value in (
        ("modelship.model", record.model),
        ("modelship.endpoint", record.endpoint),
        ("modelship.key", record.key),
        ("modelship.waited", record.waited),
    ):
        if value:  # what the caller sent (a model's name, a path) cut to tracing.CAP
            span.set_attribute(name, tracing.bounded(value))
    if record.gpu_seconds:
        span.set_attribute("modelship.gpu_seconds", record.gpu_seconds)
    if record.first_byte is not None:
        span.add_event("first byte", timestamp=tracing.at(record.first_byte))
    if record.status >= 500:
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        span.set_status(Status(StatusCode.ERROR))


# Told to a browser's script too (CORS): the request id, a refusal's wait, the replica, what
# the key's limits have left.
EXPOSED = (
    b"x-request-id, retry-after, x-modelship-replica, x-modelship-routed-by, x-modelship-cache, "
    + limit_headers.EXPOSED
)


def routing_headers(replica: int | None, reason: str) -> list[tuple[bytes, bytes]]:
    """Which replica of the deployment answered (its number, from 0) and why it was chosen
    (openai_api/routing/): a client sees its conversation stay where its cache is."""
    return [
        (b"x-modelship-replica", str(replica).encode()),
        (b"x-modelship-routed-by", reason.encode()),
    ]
