"""The ASGI server `serve` runs by default: uvicorn, with the limits a public gateway needs.

Why uvicorn rather than daphne: daphne (Twisted) reads a whole request body before the
application sees it and buffers a slow reader's answer without bound, so neither the 16 MiB
body limit nor flow control to the engine would hold. uvicorn hands the body over as it
arrives (a refused body stops being read) and makes `send` wait while the client's socket is
full, so a slow reader slows the engine's stream instead of growing the gateway. And on
`httptools` (a dependency; uvicorn picks it up) it is the fastest of the three measured side
by side (bench/README.md). Its event loop is asyncio's own (MSHIP_SERVE_LOOP): uvloop did
about 5% more requests a second at one connection and the same at 32 and 256, but once
saturated it left some connections unread for seconds (p99 3.0 s at 256 connections on two
cores, against 0.18 s on asyncio's loop).

Limits (each an MSHIP_* setting, see README):
- a connection must finish its request headers within MSHIP_HEADER_TIMEOUT_S (uvicorn has no
  such timeout of its own: a client trickling headers would hold a connection forever);
- an idle keep-alive connection is closed after MSHIP_KEEPALIVE_TIMEOUT_S;
- a request's body must be in within MSHIP_BODY_TOTAL_TIMEOUT_S (the applications answer
  408 first: openai_api/exchange.py, modelship_site/body_limits.py; this closes a connection
  whose application neither reads nor answers);
- at most MSHIP_MAX_CONNECTIONS connections and requests at once, and at most
  MSHIP_MAX_CONNECTIONS_PER_CLIENT from one address (past either: 503, admission.py), a
  Responses socket's lanes beyond its first counted as connections against both (ws_lanes.py);
- request headers of at most 64 KiB;
- a WebSocket message of at most MSHIP_MAX_BODY_BYTES (a request body's limit), and a ping
  every MSHIP_WS_PING_S that the client must answer within as long.

Run: ``python -m modelship_site.server --host 127.0.0.1 --port 8000``; ``--fd N`` serves a
listening socket the parent made and shares with its other workers (`serve --workers N`).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
from typing import Any, Literal

import uvicorn
from django.conf import settings
from django.urls import get_resolver
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from modelship_site.admission import (
    ClientCounts,
    SocketClient,
    too_many_from_client,
    too_many_in_all,
)
from ondemand.guard import BARE_QUERY
from openai_api import ws_lanes
from openai_api.sweeps import Sweep, quarter

MAX_HEADER_BYTES = 64 * 1024


def header_timeout() -> float:
    return float(settings.MSHIP_HEADER_TIMEOUT_S)


def body_timeout() -> float:
    """How long after its headers a connection's request body must be in: the body's total
    deadline, and the headers' again as a margin for the application's own 408 to go first."""
    return float(settings.MSHIP_BODY_TOTAL_TIMEOUT_S) + header_timeout()


REFUSED_UPGRADE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 0\r\nretry-after: 5\r\nconnection: close\r\n\r\n"
)

# httptools (a dependency) calls on_headers_complete; under h11 uvicorn's own cap stays.
ADMITS = hasattr(AutoHTTPProtocol, "on_headers_complete")


class HeadersTooLarge(Exception):
    pass


class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with a deadline for each request's headers: from the
    connection's start, and again from the end of each response (the next request's); and,
    once the headers are in, for its body. One sweep per event loop looks over every
    connection's deadline (openai_api/sweeps.py). It admits requests within the caps."""

    _since = 0.0
    _armed_for: Any = None
    _header_bytes = 0
    _body_since = 0.0
    _body_pending = False
    _host = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients = ClientCounts.of(self.server_state)
        self._total_cap: int | None = self.config.limit_concurrency
        if ADMITS:
            self.limit_concurrency = None  # counted here, answered as admission.py does

    # httptools (h11 has its own limit, h11_max_incomplete_event_size): the request line
    # and headers counted as they are parsed; past MAX_HEADER_BYTES the parser is stopped,
    # and uvicorn answers 400 and closes, as it does for h11's limit.
    def on_message_begin(self) -> None:
        self._header_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        super().on_header(name, value)

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            raise HeadersTooLarge(f"request headers over {MAX_HEADER_BYTES} bytes")

    def on_headers_complete(self) -> None:
        if self.url.endswith(b"?") and self.url.count(b"?") == 1:
            # A bare `?`: ASGI's query_string cannot tell it from none (/ondemand refuses
            # it: ondemand/guard.py).
            self.scope[BARE_QUERY] = True
        self._body_since = self.loop.time()
        self._body_pending = True  # until on_message_complete: at once when there is none
        if self.parser.should_upgrade() and self._should_upgrade():
            super().on_headers_complete()  # a WebSocket: admitted at the upgrade
            return
        refusal = self._refusal()
        if refusal is None:
            super().on_headers_complete()
            return
        app: Any = getattr(self, "app")  # noqa: B009 - uvicorn starts the task with self.app
        self.app = refusal
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_message_complete(self) -> None:
        self._body_pending = False
        super().on_message_complete()

    def _refusal(self) -> Any:
        """The answer to a request past a cap, counted as uvicorn counts its own (this
        connection among the open ones, the tasks before this request's)."""
        cap = self._total_cap
        # A Responses socket's lanes beyond its first count as connections (ws_lanes.py).
        open_now = len(self.connections) + ws_lanes.extra()
        if ADMITS and cap is not None and (open_now >= cap or len(self.tasks) >= cap):
            self.logger.warning("Exceeded concurrency limit.")
            return too_many_in_all
        if self._clients.over_cap(self._host):
            return too_many_from_client
        return None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._host = self.client[0] if self.client else ""
        self._clients.opened(self._host)
        self._arm()
        self._deadlines().add(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A request the client pipelined behind this one is under way now (uvicorn started
        # it just above): its own end arms the deadline. Armed now, the sweep would take its
        # connection for one waiting on headers and close it under the running request.
        if self.cycle is None or self.cycle.response_complete:
            self._arm()

    def handle_websocket_upgrade(self, *args: Any) -> None:
        # The connection is a WebSocket from here on, handed to its own protocol: no request
        # headers to wait for any more, and counted by that protocol (as uvicorn counts it).
        self._deadlines().discard(self)
        if self._clients.over_cap(self._host):
            self.transport.write(REFUSED_UPGRADE)
            self.transport.close()
            return
        self._clients.closed(self._host)
        super().handle_websocket_upgrade(*args)

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadlines().discard(self)
        self._clients.closed(self._host)
        super().connection_lost(exc)

    def _deadlines(self) -> Sweep:
        return Sweep.of(self.loop, "headers", lambda: quarter(header_timeout()))

    def _arm(self) -> None:
        self._armed_for = self.cycle
        self._since = self.loop.time()

    def sweep(self, now: float) -> bool:
        if self.cycle is not self._armed_for:
            # A request is under way. Its body must come in time too (not while uvicorn
            # stopped reading because the application has not taken what came: that wait
            # is the server's); a connection whose application waits on something else
            # with the body never sent would otherwise hold its slot for good.
            if (
                self._body_pending
                and not self.flow.read_paused
                and now - self._body_since >= body_timeout()
                and not self.transport.is_closing()
            ):
                self.transport.close()
            return False
        if now - self._since < header_timeout():
            return False
        if not self.transport.is_closing():
            # No request began since the deadline was set: headers that never finish.
            self.transport.close()
        return True


class GuardedWebSocketProtocol(AutoWebSocketsProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's WebSocket protocol, its connection counted against its address's cap like
    an HTTP one (its upgrade request was admitted as one). The application gets that count
    in its scope (ws_lanes.SCOPE_KEY), for the socket's lanes to count against it too: by
    the socket's peer, as the connection is, whatever address a proxy header gives."""

    _host = ""

    def __init__(self, config: Any, server_state: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, server_state, *args, **kwargs)
        self._clients = ClientCounts.of(server_state)
        # Every uvicorn WebSocket protocol calls self.app (config.loaded_app).
        self._application: Any = getattr(self, "app")  # noqa: B009 - untyped in the base
        self.app = self._counted

    async def _counted(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[ws_lanes.SCOPE_KEY] = SocketClient(self._clients, self._host)
        await self._application(scope, receive, send)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._host = self.client[0] if self.client else ""
        self._clients.opened(self._host)

    def connection_lost(self, exc: Exception | None) -> None:
        self._clients.closed(self._host)
        super().connection_lost(exc)


def config(
    app: Any, host: str, port: int, lifespan: Literal["on", "off"] = "off", **options: Any
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=GuardedHTTPProtocol,
        ws=GuardedWebSocketProtocol,
        lifespan=lifespan,
        access_log=False,
        timeout_keep_alive=int(settings.MSHIP_KEEPALIVE_TIMEOUT_S),
        limit_concurrency=settings.MSHIP_MAX_CONNECTIONS or None,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        ws_max_size=settings.MSHIP_MAX_BODY_BYTES,
        ws_ping_interval=settings.MSHIP_WS_PING_S,
        ws_ping_timeout=settings.MSHIP_WS_PING_S,
        loop=settings.MSHIP_SERVE_LOOP,
        **options,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="modelship-server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fd", type=int, help="a listening socket to serve, inherited")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
    from modelship_site.asgi import application  # noqa: PLC0415 - needs the settings module
    from modelship_site.gateway_start import with_route_table  # noqa: PLC0415 - the catalog needs the apps

    freeze_startup_heap()
    served = with_route_table(application)
    server = uvicorn.Server(config(served, args.host, args.port, lifespan="on"))
    # The socket's family is read from it: a peer's address stays an IP address.
    server.run(sockets=[socket.socket(fileno=args.fd)] if args.fd is not None else None)


def freeze_startup_heap() -> None:
    """Keep what start-up loaded (Django, the apps, their libraries: some 200,000 objects)
    out of the garbage collector's full collections. Each took 140 ms of this process on
    the project's machine, a stall every request in flight waited out, and the more requests
    in flight the more often it ran (bench/README.md). Those objects live as long as the
    process; what requests allocate is collected as before."""
    # What the first admin or API request would import (the URL configuration: DRF, the
    # schema views, the PostgreSQL fields), imported now so that it is frozen too.
    get_resolver().url_patterns  # noqa: B018 - read for its import side effect
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    main()
