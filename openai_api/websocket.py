"""/v1/responses over a WebSocket (the SDK's `client.responses.connect()`): a raw ASGI
application that Channels routes the upgrade to.

The handshake authenticates as a request does (Authorization, x-api-key, the trusted
identity rules) and is refused with an OpenAI-shaped HTTP answer. Then each `response.create`
event (the POST body's fields; `stream` implicit, `background` refused) runs as a foreground
response whose events go out as text frames, the same protocol as the SSE stream
(`generate: false` warms up: a response kept with no output, no engine called). Each create
is checked again as a request is (the key still valid, its rate, its models).

One response at a time on a lane: the default lane, or the one a create's `stream_id` names
(events then carry it); lanes run side by side, at most MSHIP_WS_MAX_LANES on a socket, each
beyond the first counted as a connection of its own against the server's cap and its
address's (ws_lanes.py): one address's sockets cannot hold more than its share.
A create for a busy lane is an `error` event, and so is any refusal: the socket stays open.
Each message is read as a request body is (bodies.json_value: the same depth limit).
Responses made on the socket, stored or not, can be continued from it by
`previous_response_id` (the last MAX_REMEMBERED, at most MSHIP_WS_CONTEXT_BYTES of their
context in all, in memory; the oldest go first), stored ones from the store as well. One
neither remembers nor finds is `previous_response_not_found` (400), and a continuation that
fails forgets the response it continued (the Open Responses WebSocket rules). There is no
compaction event: POST /v1/responses/compact's window is the input of a new response.
A close cancels the responses under way, as a hang-up cancels a request: their engines see
the request closed.

The protocol has no keepalive event: the server's WebSocket pings (MSHIP_WS_PING_S) keep the
connection alive while a response waits for its slot (a cold start, the memory queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import orjson
from django.conf import settings

from common.request_id import make_request_id
from openai_api import access, ws_lanes
from openai_api.auth import authenticate, last_used
from openai_api.bodies import json_value
from openai_api.catalog import catalog
from openai_api.errors import TYPES, GatewayError
from openai_api.exchange import cors_allowed, json_headers
from openai_api.gateway import check_response_scope, responses_route
from openai_api.models import shown_prefix
from openai_api.output_tokens import check_output_tokens
from openai_api.rate_limits import rate_limiter
from openai_api.responses.fields import bad
from openai_api.responses.foreground import Opening, run
from openai_api.responses.turn import Turn, prepare
from openai_api.routing import hints
from openai_api.usage.recording import admit, most_tokens

if TYPE_CHECKING:
    from openai_api.exchange import Receive, Scope, Send
    from openai_api.keepalive import SseOpener
    from openai_api.responses.translator import Event

log = logging.getLogger(__name__)
PATH = "/v1/responses"
MAX_REMEMBERED = 64  # responses a socket can continue from memory
DEFAULT_LANE = ""


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    request_id = make_request_id(headers.get("x-request-id"))
    peer = (scope.get("client") or ("", 0))[0]
    try:
        check_handshake(scope, headers)
        authenticate(await catalog.current(), headers, peer)
    except GatewayError as exc:
        return await deny(scope, send, exc, request_id)
    await send({"type": "websocket.accept", "headers": [(b"x-request-id", request_id.encode())]})
    socket = Socket(send, headers, peer, ws_lanes.client_of(scope))
    ws_lanes.socket_opened()
    try:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                break
            if message["type"] == "websocket.receive":
                await socket.received(message.get("text") or message.get("bytes") or b"")
    except ClientGone:
        pass
    finally:
        ws_lanes.socket_closed()
        await socket.closed()


def check_handshake(scope: Scope, headers: dict[str, str]) -> None:
    """Only /v1/responses has a socket. A browser page of another origin cannot open one
    with the caller's standing (the gateway may trust its network); other clients send no
    Origin."""
    if scope["path"].rstrip("/") != PATH:
        raise GatewayError(404, f"Unknown WebSocket path {scope['path']}.", "not_found")
    origin = headers.get("origin")
    if origin and not cors_allowed(origin):
        raise GatewayError(403, "Cross-origin WebSockets are not allowed here.", "cors_forbidden")


async def deny(scope: Scope, send: Send, exc: GatewayError, request_id: str) -> None:
    """Refuse the handshake with an HTTP answer (its status and OpenAI-shaped body) where
    the server can send one, else by closing before accepting (a 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = exc.body()
    headers = json_headers(body, request_id, exc.headers)
    await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


def error_event(exc: GatewayError, lane: str) -> dict[str, Any]:
    error: dict[str, Any] = {
        "type": TYPES.get(exc.status, "server_error"),
        "code": exc.code,
        "message": exc.message,
        "param": exc.param,
    }
    if exc.headers:
        error["headers"] = exc.headers
    event = {"type": "error", "status": exc.status, "error": error}
    return {**event, "stream_id": lane} if lane else event


def previous_not_found(response_id: str) -> GatewayError:
    """A continuation of a response this socket does not remember and the store does not
    hold (never made, another caller's, or made with `store: false` elsewhere)."""
    return GatewayError(
        400,
        f"Previous response with id {response_id!r} not found.",
        "previous_response_not_found",
        param="previous_response_id",
    )


def json_size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # an integer past 64 bits, which orjson does not write
        return len(json.dumps(value))


def too_many_lanes(full: str) -> GatewayError:
    if full == "socket":
        return GatewayError(
            429,
            f"This socket already has {settings.MSHIP_WS_MAX_LANES} responses in progress;"
            " send the next one when one ends.",
            "too_many_streams",
        )
    if full == "client":
        return GatewayError(
            503,
            "Too many connections from your address at once (each response beyond a"
            " socket's first counts as one); try again shortly.",
            "server_busy",
        )
    return GatewayError(
        503, "The server is at its connection limit; try again shortly.", "server_busy"
    )


class ClientGone(Exception):
    """The client closed the socket while something was being sent to it."""


class Socket:
    """One connection: its lanes' responses under way and what it can continue from."""

    def __init__(
        self,
        send: Send,
        headers: dict[str, str],
        peer: str,
        client: ws_lanes.ClientLanes | None = None,
    ) -> None:
        self._send = send
        self.headers = headers
        self.peer = peer
        self.client = client  # its address's count, where the server keeps one
        self.lanes: dict[str, asyncio.Task[None]] = {}
        self.known: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.known_bytes: dict[str, int] = {}  # each remembered context's size, as JSON
        self._sending = asyncio.Lock()

    async def send(self, event: dict[str, Any], lane: str = DEFAULT_LANE) -> None:
        if lane:
            event = {**event, "stream_id": lane}
        async with self._sending:
            try:
                # orjson, as the SSE path: an event per token.
                text = orjson.dumps(event).decode()
                await self._send({"type": "websocket.send", "text": text})
            except OSError as exc:  # the client went away: its close ends what is under way
                raise ClientGone from exc

    async def received(self, raw: str | bytes) -> None:
        lane = DEFAULT_LANE
        try:
            # As a request body is read: the depth limit, one pass whatever the text.
            event = json_value(raw.encode() if isinstance(raw, str) else raw)
        except GatewayError as exc:
            return await self.send(error_event(exc, lane))
        if not isinstance(event, dict):
            return await self.send(error_event(bad("A client event is a JSON object."), lane))
        stream_id = event.get("stream_id")
        if stream_id is not None and (not isinstance(stream_id, str) or not stream_id):
            error = bad("'stream_id' must be a non-empty string.", "stream_id")
            return await self.send(error_event(error, lane))
        lane = stream_id or DEFAULT_LANE
        kind = event.get("type")
        if kind != "response.create":
            error = bad(
                f"Unsupported client event {kind!r}: only response.create is served here.", "type"
            )
            return await self.send(error_event(error, lane))
        if lane in self.lanes:
            busy = GatewayError(
                409,
                "A response is already in progress on this stream; send the next one when it"
                " ends, or on another stream_id.",
                "response_already_in_flight",
            )
            return await self.send(error_event(busy, lane))
        if (full := ws_lanes.may_open(len(self.lanes), self.client)) is not None:
            return await self.send(error_event(too_many_lanes(full), lane))
        ws_lanes.lane_started(len(self.lanes), self.client)
        self.lanes[lane] = asyncio.create_task(self.create(event, lane))

    def release(self, lane: str) -> None:
        """The lane's room free again, once: whether its task ended or was cancelled."""
        if self.lanes.pop(lane, None) is not None:
            ws_lanes.lane_ended(len(self.lanes) + 1, self.client)

    async def create(self, event: dict[str, Any], lane: str) -> None:
        """A response on a lane, counted as a request of its own: its access line, metrics,
        usage and GPU-seconds (openai_api/access.py)."""
        with access.counted_apart(make_request_id(None), gateway="ws") as record:
            await self.respond(event, lane, record)

    async def respond(self, event: dict[str, Any], lane: str, record: access.RequestRecord) -> None:
        data = {k: v for k, v in event.items() if k not in ("type", "stream_id")}
        request_id = record.request_id
        record.body_bytes = len(json.dumps(data))  # its estimate, where it ends with no usage
        out = SocketOut(self, lane, record)
        turn: Turn | None = None
        previous = data.get("previous_response_id")
        record.status = 200  # unless refused below
        try:
            if data.get("background"):
                raise bad("background is not available over a WebSocket.", "background")
            generate = data.pop("generate", True)
            if not isinstance(generate, bool):
                raise bad("'generate' must be a boolean.", "generate")
            data["stream"] = True  # implicit over a socket
            turn = await self.prepare(data)
            await run(turn, out, request_id, generate)
            if turn.translator.response["status"] in ("completed", "incomplete"):
                self.remember(turn)
            else:
                self.forget(previous)
        except GatewayError as exc:
            self.forget(previous)
            record.status = exc.status
            with contextlib.suppress(ClientGone):
                await self.send(error_event(exc, lane))
        except ClientGone:
            pass  # the receive loop sees the close and ends the socket
        except Exception:
            self.forget(previous)
            record.status = 500
            log.exception("a WebSocket response failed (request %s)", request_id)
            message = f"The server had an error processing the request {request_id}."
            with contextlib.suppress(ClientGone):
                if turn is not None and out.opened:  # the response under way ends as failed
                    await out.emit(turn.translator.fail("internal_error", message))
                else:
                    await self.send(error_event(GatewayError(500, message, "internal_error"), lane))
        finally:
            # Before the task ends: the lane is free the moment its terminal event is out.
            self.release(lane)

    async def prepare(self, data: dict[str, Any]) -> Turn:
        """A create, checked as a POST is: the caller, its rate, the model, its scope."""
        snapshot = await catalog.current()
        caller = authenticate(snapshot, self.headers, self.peer)
        if caller.key is not None:
            await rate_limiter.check(caller.key)
            last_used.touch(caller.key)
        if not isinstance(data.get("model"), str):
            raise bad("'model' is required.", "model")
        route = responses_route(snapshot, caller, data["model"])
        if (record := access.current.get()) is not None:
            record.model, record.identity, record.key_ref = route.name, caller.identity, caller.key
            record.key = shown_prefix(caller.key.prefix) if caller.key is not None else ""
        # Its budgets, as a POST's: the most it can spend held until its record ends.
        size = record.body_bytes if record is not None else 0
        held = await admit(caller.key, most_tokens("responses", route, data, size))
        if record is not None:
            record.reservation = held
        check_output_tokens(route, data)
        hints.note(route, data, self.headers, str(caller.key.id) if caller.key else "")
        previous = data.get("previous_response_id")
        try:
            if isinstance(previous, str) and previous not in self.known:
                await check_response_scope(caller, snapshot, previous)
            return await prepare(route, caller.identity, data, self.known)
        except GatewayError as exc:
            # store.not_found, for the only response a create looks up: its previous one
            if isinstance(previous, str) and (exc.status, exc.param) == (404, "response_id"):
                raise previous_not_found(previous) from exc
            raise

    def forget(self, response_id: Any) -> None:
        """A continuation failed: the response it continued is no longer continued from
        memory (a stored one still is, from the store)."""
        if isinstance(response_id, str):
            self.known.pop(response_id, None)
            self.known_bytes.pop(response_id, None)

    def remember(self, turn: Turn) -> None:
        response = turn.translator.response
        context = [*turn.context, *response["output"]]
        size = json_size(context)
        if size > settings.MSHIP_WS_CONTEXT_BYTES:
            return  # alone over the bound: continued from the store, if it was stored
        self.known[response["id"]] = context
        self.known_bytes[response["id"]] = size
        while (
            len(self.known) > MAX_REMEMBERED
            or sum(self.known_bytes.values()) > settings.MSHIP_WS_CONTEXT_BYTES
        ):
            oldest, _ = self.known.popitem(last=False)
            self.known_bytes.pop(oldest, None)

    async def closed(self) -> None:
        """The client went away: its responses under way end as a hang-up ends a request."""
        tasks = list(self.lanes.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A task cancelled before it began (its create and the close read in one go) never
        # ran its `finally`: its lane is released here, or it would be counted for good.
        for lane in list(self.lanes):
            self.release(lane)


class SocketOut:
    """A response's way out on a socket: each event a text frame on its lane. Its opening
    events wait for the engine's first answer, so a refusal before that is an `error`
    event rather than a response that failed."""

    opener: SseOpener | None = None  # no SSE keepalives: the server's pings

    def __init__(self, socket: Socket, lane: str, record: access.RequestRecord) -> None:
        self.socket = socket
        self.lane = lane
        self.record = record
        self.opened = False
        self.opening = Opening()

    async def emit(self, events: list[Event]) -> None:
        if not (events := self.opening.release(events)):
            return
        self.opened = True
        for event in events:
            if str(event.get("type", "")).endswith(".delta"):
                self.record.events += 1  # a token each: the estimate of a response cut short
            await self.socket.send(event, self.lane)
