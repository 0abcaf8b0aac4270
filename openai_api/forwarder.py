"""The one streaming forwarder, shared by /v1 and /ondemand.

One pooled aiohttp session per engine. The request goes up with the caller's secrets and
hop-by-hop headers removed, the engine's own secret as its Authorization
(deployments/engine_secrets.py), and `Accept-Encoding: identity`; the engine's status, headers
(less hop-by-hop, Server and Date) and bytes come back chunk by chunk, unbuffered and
unparsed. A caller that hangs up cancels the upstream request, so the engine sees its
connection close. Where Modelship opened a streaming answer while the request waited for its
slot (openai_api/keepalive.py), the engine's bytes follow inside it and an engine error
arrives as `data: {"error": ...}` then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from django.conf import settings

from common import tracing
from openai_api.engine_auth import engine_auth
from openai_api.engine_error_codes import normalized, openai_code
from openai_api.engine_use import Using
from openai_api.errors import GatewayError, error_body
from openai_api.sweeps import Sweep

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class Watched(Protocol):
    """What the hang-up watch needs of a request (the exchange): its receive channel, and a
    slot it fills to hear when the answer starts as a stream."""

    receive: Receive
    on_stream: Callable[[], None] | None
    finished: bool  # the answer's last byte went out


HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
# Never sent to an engine: the caller's secrets, its address as a proxy saw it, and ours.
REQUEST_DROP = HOP_BY_HOP | {
    "authorization",
    "x-api-key",
    "cookie",
    "host",
    "content-length",
    "accept-encoding",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-real-ip",
    # A probe is answered by the on-demand gateway, never sent (ours and the seed's name).
    "x-modelship-health-check",
    "x-dgxmm-health-check",
}
RESPONSE_DROP = HOP_BY_HOP | {"server", "date"}
# As the engine's raw header names come (lowercased), with the engine's own request id: the
# gateway's replaces it.
RESPONSE_DROP_RAW = frozenset(name.encode() for name in RESPONSE_DROP | {"x-request-id"})
# An engine's error answer is read whole to put its code in OpenAI's words; past this it is
# passed on as it comes (an engine, or whatever answers at its address, sets its size).
ERROR_READ_CAP = 1 << 20
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse_start(request_id: str) -> dict[str, Any]:
    """The start of a 200 answer of server-sent events."""
    headers = [*SSE_HEADERS, (b"x-request-id", request_id.encode())]
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    """Up to `cap` bytes of an answer, and whether that was all of it."""
    parts: list[bytes] = []
    size = 0
    while size <= cap:
        chunk = await response.content.read(cap + 1 - size)
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


async def pass_on(send: Send, response: aiohttp.ClientResponse, head: bytes = b"") -> None:
    """The rest of an engine's answer as it comes (after `head`, what was read of it), then
    the end of the caller's."""
    if head:
        await send({"type": "http.response.body", "body": head, "more_body": True})
    async for chunk in response.content.iter_any():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def engine_error_of(response: aiohttp.ClientResponse) -> tuple[str, str | None]:
    """An engine's error answer: its message (else its text) and its own code, if it gave
    one (vLLM's and llama.cpp's are OpenAI-shaped)."""
    raw, whole = await read_capped(response, ERROR_READ_CAP)
    try:
        if not whole:
            raise ValueError("past the cap")
        error = json.loads(raw)["error"]
        return str(error["message"]), openai_code(response.status, error)
    except (ValueError, KeyError, TypeError, AttributeError):
        text = raw.decode(errors="replace")[:500]
        return text or f"the engine answered {response.status}", None


def upstream_headers(headers: list[tuple[bytes, bytes]], request_id: str) -> dict[str, str]:
    named_in_connection = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.decode("latin-1").split(",")
    }
    out: dict[str, str] = {}
    identity = settings.MSHIP_TRUSTED_IDENTITY_HEADER  # the proxy's word, not the engine's
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name in REQUEST_DROP or name in named_in_connection or name == identity:
            continue
        out[name] = raw_value.decode("latin-1")
    out["accept-encoding"] = "identity"
    out["x-request-id"] = request_id
    tracing.inject(out)  # the engine continues the request's trace (W3C traceparent)
    return out


def downstream_headers(
    response: aiohttp.ClientResponse, request_id: str
) -> list[tuple[bytes, bytes]]:
    connection = response.headers.get("connection")
    dropped = RESPONSE_DROP_RAW
    if connection:  # the names it lists are hop-by-hop too
        named = {t.strip().lower().encode("latin-1", "replace") for t in connection.split(",")}
        dropped = dropped | named
    headers = [
        (name, value) for raw, value in response.raw_headers if (name := raw.lower()) not in dropped
    ]
    headers.append((b"x-request-id", request_id.encode()))
    return headers


@dataclass(frozen=True)
class Call:
    """One request to forward.

    `committed`: SSE headers already went out (the engine's bytes follow them; its errors
    become SSE error events). `transform`: the whole answer is read, rewritten and sent with
    its new length (the queued notice).
    """

    method: str
    url: str
    base_url: str
    body: bytes
    headers: list[tuple[bytes, bytes]]
    request_id: str
    streaming: bool
    committed: bool = False
    transform: Callable[[bytes], bytes] | None = None
    unreachable_code: str = "upstream_error"
    deployment: str = "the deployment"  # named in errors instead of the engine's address
    raw_errors: bool = False  # 4xx/5xx as the engine wrote them (/ondemand, as its seed says)


# A reused connection the engine had closed fails at once; later, the engine had the request.
STALE_WITHIN_S = 0.25


async def requested(
    session: aiohttp.ClientSession, method: str, url: str, **options: Any
) -> aiohttp.ClientResponse:
    """An engine's answer (its status and headers). A kept-alive connection the engine closed
    as it was reused, before a byte of an answer (llama.cpp's server drops idle ones), is
    tried once more, on another connection."""
    began = time.monotonic()
    try:
        return await session.request(method, url, allow_redirects=False, **options)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
        # Dropped as it was sent, or while its body was (a reset, a broken pipe).
        if time.monotonic() - began > STALE_WITHIN_S:
            raise  # it had the request a while: it may have worked on it, so not again
        return await session.request(method, url, allow_redirects=False, **options)


class Forwarder:
    def __init__(self) -> None:
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self.active: dict[str, int] = {}  # streams in flight per engine
        self.retired: set[str] = set()  # engines to close once their last stream ends

    def session(self, base_url: str) -> aiohttp.ClientSession:
        session = self.sessions.get(base_url)
        if session is None or session.closed:
            limit = settings.MSHIP_ENGINE_CONNECTIONS
            connector = aiohttp.TCPConnector(
                # Below the engines' own idle timeout (uvicorn's and llama.cpp's, 5 s), so the
                # gateway, not the engine, closes an idle connection.
                limit=limit,
                limit_per_host=limit,
                keepalive_timeout=4,
            )
            # connect: waiting for a pooled connection plus making one; no read timeout,
            # since generation can be long.
            timeout = aiohttp.ClientTimeout(total=None, connect=60, sock_connect=10)
            # No cookie jar: a cookie one engine answer set must never go up with another
            # caller's request (and the jar's filtering cost every request).
            session = aiohttp.ClientSession(
                base_url=None,
                connector=connector,
                timeout=timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                middlewares=(engine_auth(base_url),),
            )
            self.sessions[base_url] = session
        return session

    async def forward(self, call: Call, send: Send) -> None:
        """Forward one request and send its answer. The caller watches for hang-ups (see
        `cancel_on_hangup`): a cancellation closes the engine's connection."""
        async with self.using(call.base_url) as session:
            await self._relay(call, session, send)

    def using(self, base_url: str) -> Using:
        """The engine's session, counted as in use until the block ends, and the request's
        share of the engine's GPU time for as long (openai_api/usage/gpu_time.py)."""
        return Using(self, base_url)

    async def done_with(self, base_url: str) -> None:
        self.active[base_url] -= 1
        if not self.active[base_url]:
            del self.active[base_url]
            if base_url in self.retired:
                await self._close(base_url)

    async def retire(self, live: set[str]) -> None:
        """Close the sessions of engines no route points at any more (a restart on a new
        address); one still streaming is closed when its last stream ends."""
        for base_url in [u for u in self.sessions if u not in live]:
            if self.active.get(base_url):
                self.retired.add(base_url)
            else:
                await self._close(base_url)
        self.retired &= set(self.sessions) - live

    async def _close(self, base_url: str) -> None:
        self.retired.discard(base_url)
        session = self.sessions.pop(base_url, None)
        if session is not None:
            await session.close()

    async def _relay(self, call: Call, session: aiohttp.ClientSession, send: Send) -> None:
        request_id, committed = call.request_id, call.committed
        headers = upstream_headers(call.headers, request_id)
        try:
            response = await requested(
                session, call.method, call.url, data=call.body, headers=headers
            )
        except aiohttp.ClientError as exc:
            raise GatewayError(
                502, unreachable(exc, call.deployment), call.unreachable_code
            ) from exc
        try:
            reworded = response.status >= 400 and not call.raw_errors
            if committed:
                await self._relay_into_open_stream(send, response)
            elif call.transform is not None and (response.status < 400 or reworded):
                await self._relay_transformed(send, response, request_id, call.transform)
            elif reworded:
                await self._relay_transformed(send, response, request_id, None)
            else:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": downstream_headers(response, request_id),
                    }
                )
                await pass_on(send, response)
        except aiohttp.ClientError as exc:
            # The engine went away mid-answer: end the answer where it broke.
            log.warning("engine stream broke: %s", exc)
            response.close()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        except BaseException:
            # The caller hung up: close the engine's connection so it stops generating.
            response.close()
            raise
        response.release()

    async def _relay_transformed(
        self,
        send: Send,
        response: aiohttp.ClientResponse,
        request_id: str,
        transform: Callable[[bytes], bytes] | None,
    ) -> None:
        """The engine's whole answer, changed: a success by `transform`, an error's numeric
        code made a word (engine_error_codes). An error past ERROR_READ_CAP goes on as it is."""
        headers = [
            (name, value)
            for name, value in downstream_headers(response, request_id)
            if name != b"content-length"
        ]
        start = {"type": "http.response.start", "status": response.status, "headers": headers}
        if response.status == 200:
            raw = await response.read()
            body = transform(raw) if transform is not None else raw
        else:
            raw, whole = await read_capped(response, ERROR_READ_CAP)
            if not whole:
                await send(start)
                await pass_on(send, response, raw)
                return
            body = normalized(response.status, raw) or raw
        headers.append((b"content-length", str(len(body)).encode()))
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_into_open_stream(self, send: Send, response: aiohttp.ClientResponse) -> None:
        """Modelship opened the stream while the request waited (keepalives, the queued
        notice): the engine's bytes follow inside it, and an engine error is its last event."""
        if response.status != 200:
            message, code = await engine_error_of(response)
            await send_sse_error(send, response.status, message, code or "upstream_error")
            return
        await pass_on(send, response)

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()
        self.sessions.clear()
        self.retired.clear()


def unreachable(exc: Exception, deployment: str) -> str:
    """The caller learns which deployment failed and how, never the engine's address (the
    exception's text has it; the log keeps it)."""
    log.warning("engine of %s unreachable: %s: %s", deployment, exc.__class__.__name__, exc)
    return f"The engine of {deployment} could not be reached ({exc.__class__.__name__})."


HANGUP_WATCH_AFTER_S = 0.25


def _watch_after() -> float:
    return HANGUP_WATCH_AFTER_S


class cancel_on_hangup:
    """Cancel the body of the block when the caller hangs up: a pending acquire leaves the
    queue, a forwarded request closes its engine connection. The hang-up ends the block
    quietly; the request's body must have been read before.

    The watch (a task waiting on `receive` for the disconnect) starts once the answer turns
    out to be a stream (the exchange's SSE start), else once the block has run
    HANGUP_WATCH_AFTER_S: most answers are done by then, and a task made and cancelled per
    request was a measurable share of the gateway's CPU (bench/README.md). A caller who
    leaves a long wait is seen within up to twice that (the sweep looks every
    HANGUP_WATCH_AFTER_S); one who leaves a stream, at once."""

    __slots__ = ("due", "exchange", "gone", "sweeps", "task", "watcher")

    def __init__(self, exchange: Watched) -> None:
        self.exchange = exchange
        self.gone = False
        self.watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        loop = task.get_loop()
        self.due = loop.time() + HANGUP_WATCH_AFTER_S
        self.sweeps = Sweep.of(loop, "hangup", _watch_after)
        self.sweeps.add(self)
        self.exchange.on_stream = self.watch_now

    def sweep(self, now: float) -> bool:
        # The sweep runs every HANGUP_WATCH_AFTER_S whatever each block's age: a block that
        # began just before it is left for the next one, not watched at once.
        if now < self.due:
            return False
        self.watch_now()
        return True

    def watch_now(self) -> None:
        if self.watcher is None:
            self.sweeps.discard(self)
            self.watcher = asyncio.ensure_future(self.watch())

    async def watch(self) -> None:
        while (await self.exchange.receive())["type"] != "http.disconnect":
            pass
        if self.exchange.finished:
            return  # it had its whole answer: what is left (its accounting) runs on
        self.gone = True
        self.task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        self.exchange.on_stream = None
        self.sweeps.discard(self)
        if self.watcher is not None:
            self.watcher.cancel()
        if kind is not None and issubclass(kind, asyncio.CancelledError) and self.gone:
            self.task.uncancel()  # the caller's hang-up, not ours: nothing left to do
            return True
        return False


async def send_sse_error(send: Send, status: int, message: str, code: str) -> None:
    payload = error_body(status, message, code)
    await send(
        {"type": "http.response.body", "body": b"data: " + payload + b"\n\n", "more_body": True}
    )
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


forwarder = Forwarder()
