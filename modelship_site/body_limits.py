"""The gateway's body limits on Django's side: every path that is not /v1 or /ondemand.

Django's ASGI handler reads a whole request body into a temporary file before any view
runs, with no size or time limit of its own: a body that never ends held its connection
slot for good, and a large one filled the disk. This wrapper sits in front of it:

- a body limit per route: MSHIP_MAX_DJANGO_BODY_BYTES for /api and the admin, none at all
  for the rest (/health, /readyz, /metrics, static files: GET-only). A declared length over
  the limit is 413 before a byte of the body is read; a chunked body is counted as Django
  reads it and refused once past the limit;
- the gateway's deadlines for the body (openai_api/exchange.py's BodyDeadline): it may stall
  at most MSHIP_BODY_IDLE_TIMEOUT_S, and must be in within MSHIP_BODY_TOTAL_TIMEOUT_S;
  past either, 408.

A refusal closes the connection (the rest of the body is never read). Django is told the
client left (its read ends quietly, no view runs), and the wrapper answers: JSON on /api
(DRF's {"detail": ...}), plain text elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from django.conf import settings

from common.request_id import make_request_id
from openai_api.exchange import BodyDeadline, body_sweep

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    Message = dict[str, Any]
    Scope = dict[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    App = Callable[[Scope, Receive, Send], Awaitable[None]]

# The paths of Django's that take a body; every other one answers GET and HEAD only.
BODY_ROUTES = ("/api/", "/admin/")
DISCONNECT: Message = {"type": "http.disconnect"}


def body_limit(path: str) -> int:
    return settings.MSHIP_MAX_DJANGO_BODY_BYTES if path.startswith(BODY_ROUTES) else 0


def too_large(limit: int) -> str:
    if limit == 0:
        return "This path takes no request body."
    return f"The request body is larger than {limit} bytes."


class BodyGuard:
    """One request's body, handed to Django chunk by chunk within the limit and deadlines;
    `refusal` is what to answer instead once one of them is passed."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.size = 0
        self.done = False
        self.started = False
        self.refusal: tuple[int, str] | None = None
        self.watch: BodyDeadline | None = None

    async def receive(self) -> Message:
        if self.refusal is not None:
            return DISCONNECT
        if self.done:
            return await self._receive()  # Django listening for a hang-up: no deadline
        loop = asyncio.get_running_loop()
        if self.watch is None:
            # Made here, in the task that reads (the one the deadline cancels).
            self.watch = BodyDeadline.for_body(loop)
            body_sweep(loop).add(self.watch)
        watch = self.watch
        watch.waiting = True
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            if not watch.expired:
                raise
            watch.task.uncancel()
            return self.refuse(408, watch.reason())
        finally:
            watch.waiting = False
        if message["type"] != "http.request":
            self.finish()
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.limit:
            return self.refuse(413, too_large(self.limit))
        if message.get("more_body"):
            watch.last = loop.time()  # a trickle, not a stall
        else:
            self.finish()
        return message

    async def send(self, message: Message) -> None:
        self.started = True
        await self._send(message)

    def refuse(self, status: int, message: str) -> Message:
        self.refusal = (status, message)
        self.finish()
        return DISCONNECT

    def finish(self) -> None:
        self.done = True
        if self.watch is not None:
            body_sweep(self.watch.task.get_loop()).discard(self.watch)


def declares_body(headers: dict[bytes, bytes]) -> bool:
    return b"transfer-encoding" in headers or headers.get(b"content-length", b"0") not in (
        b"0",
        b"",
    )


async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    """Answer and close: the rest of the body is never read."""
    headers = dict(scope.get("headers") or [])
    if scope["path"].startswith("/api"):
        body = json.dumps({"detail": message}).encode()
        content_type = b"application/json"
    else:
        body = message.encode() + b"\n"
        content_type = b"text/plain; charset=utf-8"
    request_id = make_request_id((headers.get(b"x-request-id") or b"").decode("latin-1"))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id.encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def guarded(app: App) -> App:
    """Django's ASGI application behind the body limits."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if not declares_body(headers):
            await app(scope, receive, send)
            return
        limit = body_limit(scope["path"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await refuse(scope, send, 413, too_large(limit))
            return
        guard = BodyGuard(receive, send, limit)
        try:
            await app(scope, guard.receive, guard.send)
        finally:
            guard.finish()
        if guard.refusal is not None and not guard.started:
            await refuse(scope, send, *guard.refusal)

    return application
