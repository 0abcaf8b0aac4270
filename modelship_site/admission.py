"""Which connections the server takes a request from: at most MSHIP_MAX_CONNECTIONS at once
in all, and at most MSHIP_MAX_CONNECTIONS_PER_CLIENT from one client address.

A Responses WebSocket's lanes beyond its first count as connections of its address too
(openai_api/ws_lanes.py): one address holding a few sockets with many lanes each has no more
room than one holding as many plain connections. The socket's protocol hands the application
a `SocketClient` for that (modelship_site/server.py); past the cap a lane is refused there.

Both are counted where uvicorn counts its own cap (the server's open connections, checked
as each request's headers are in), so that one address holding thousands of half-sent
requests cannot take every slot: past its share its requests are refused, and everyone
else's still have room. The address is the socket's peer: behind a reverse proxy every
client is the proxy, so there the cap belongs in the proxy (set 0 here).

A refusal is a 503 with Retry-After that closes the connection: OpenAI-shaped on the
gateway's paths, DRF-shaped on /api, plain text elsewhere. Each refused address is logged
at most once every LOG_EVERY_S seconds, with how many were refused meanwhile.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from openai_api.errors import error_body

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    Scope = dict[str, Any]
    Receive = Callable[[], Awaitable[dict[str, Any]]]
    Send = Callable[[dict[str, Any]], Awaitable[None]]

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0
RETRY_AFTER_S = "5"
GATEWAY_PREFIXES = ("/v1", "/ondemand", "/rerank", "/score")


@dataclass
class Client:
    connections: int = 0
    lanes: int = 0  # its Responses sockets' lanes beyond each socket's first
    refused: int = 0  # since the last log line
    logged_at: float = float("-inf")

    @property
    def held(self) -> int:
        """What the address holds against its cap."""
        return self.connections + self.lanes


class ClientCounts:
    """The open connections of one server (one uvicorn ServerState), per client address."""

    _of: weakref.WeakKeyDictionary[Any, ClientCounts] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.clients: dict[str, Client] = {}

    @classmethod
    def of(cls, server_state: Any) -> ClientCounts:
        counts = cls._of.get(server_state)
        if counts is None:
            counts = cls._of[server_state] = cls()
        return counts

    def _client(self, host: str) -> Client:
        client = self.clients.get(host)
        if client is None:
            client = self.clients[host] = Client()
        return client

    def _release(self, host: str, client: Client) -> None:
        if client.connections <= 0 and client.lanes <= 0:
            del self.clients[host]  # an address gone leaves nothing behind

    def opened(self, host: str) -> None:
        self._client(host).connections += 1

    def closed(self, host: str) -> None:
        client = self.clients.get(host)
        if client is None:
            return
        client.connections -= 1
        # Its socket's lanes, if it was one, end after it (their tasks see the close).
        self._release(host, client)

    def lane_opened(self, host: str) -> None:
        self._client(host).lanes += 1

    def lane_closed(self, host: str) -> None:
        client = self.clients.get(host)
        if client is None:
            return
        client.lanes -= 1
        self._release(host, client)

    def over_cap(self, host: str, adding: int = 0) -> bool:
        """Whether the address holds more than its cap (its request's own connection is
        counted already), or would with `adding` more (a lane about to open); a refusal."""
        cap = int(settings.MSHIP_MAX_CONNECTIONS_PER_CLIENT)
        client = self.clients.get(host)
        if cap <= 0 or client is None or client.held + adding <= cap:
            return False
        client.refused += 1
        now = time.monotonic()
        if now - client.logged_at >= LOG_EVERY_S:
            log.warning(
                "refused %d request(s) from %s: %d connections open from that address"
                " (%d of them WebSocket lanes; MSHIP_MAX_CONNECTIONS_PER_CLIENT=%d)",
                client.refused,
                host,
                client.held,
                client.lanes,
                cap,
            )
            client.logged_at, client.refused = now, 0
        return True


class SocketClient:
    """A Responses socket's address as its server counts it: what the socket's lanes add to
    that address's count (openai_api/ws_lanes.ClientLanes)."""

    def __init__(self, counts: ClientCounts, host: str) -> None:
        self.counts = counts
        self.host = host

    def full(self) -> bool:
        return self.counts.over_cap(self.host, adding=1)

    def lane_started(self) -> None:
        self.counts.lane_opened(self.host)

    def lane_ended(self) -> None:
        self.counts.lane_closed(self.host)


def refusal(message: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI application that answers 503 and closes, without reading the body."""

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if path.startswith(GATEWAY_PREFIXES):
            body = error_body(503, message, "too_many_connections")
            content_type = b"application/json"
        elif path.startswith("/api"):
            body = json.dumps({"detail": message}).encode()
            content_type = b"application/json"
        else:
            body = message.encode() + b"\n"
            content_type = b"text/plain; charset=utf-8"
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", RETRY_AFTER_S.encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


too_many_from_client = refusal("Too many connections from your address at once; retry later.")
too_many_in_all = refusal("The server is at its connection limit; retry later.")
