"""How many responses the Responses WebSockets of this process have under way, for the
server's connection caps.

A socket is one connection, but each lane (a `stream_id`) runs a response of its own, as a
request on a connection of its own would: a caller with one socket and a thousand lanes must
not hold a thousand engine requests while counted as one connection. So a socket may run at
most MSHIP_WS_MAX_LANES lanes at once, and every lane beyond a socket's first counts as one
more connection against MSHIP_MAX_CONNECTIONS: `extra()` is what the server adds to its count
of open connections (modelship_site/server.py), and a lane is refused here when the server is
full by that count.

Those lanes count against their address's MSHIP_MAX_CONNECTIONS_PER_CLIENT as well, so that
one address holding sockets with many lanes each cannot fill the server past its share: the
server's WebSocket protocol puts the address's count in the socket's scope (a ClientLanes
under SCOPE_KEY; modelship_site/admission.py), a lane is refused when its address is full by
it, and a plain request from that address is refused while its lanes hold its share.

One event loop per process serves the sockets, so plain integers suffice (no lock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

if TYPE_CHECKING:
    from collections.abc import Mapping

SCOPE_KEY = "modelship.client_lanes"

_state = {"sockets": 0, "extra": 0}


class ClientLanes(Protocol):
    """A socket's address as the server counts it against its per-client cap."""

    def full(self) -> bool:
        """Whether one more lane would pass the address's cap (and the refusal is noted)."""
        ...

    def lane_started(self) -> None: ...

    def lane_ended(self) -> None: ...


def client_of(scope: Mapping[str, Any]) -> ClientLanes | None:
    """The socket's address count, where the server keeps one (modelship_site/server.py)."""
    client: ClientLanes | None = scope.get(SCOPE_KEY)
    return client


def extra() -> int:
    """Lanes under way beyond each socket's first: connections the server does not see."""
    return _state["extra"]


def sockets() -> int:
    return _state["sockets"]


def socket_opened() -> None:
    _state["sockets"] += 1


def socket_closed() -> None:
    _state["sockets"] -= 1


def may_open(running: int, client: ClientLanes | None = None) -> str | None:
    """Why a socket already running `running` lanes may not start one more ("socket": its
    own limit, "client": its address's, "server": the server's); None when it may."""
    per_socket = int(settings.MSHIP_WS_MAX_LANES)
    if per_socket and running >= per_socket:
        return "socket"
    if running < 1:
        return None  # the socket's first lane: the socket itself was counted
    if client is not None and client.full():
        return "client"
    cap = int(settings.MSHIP_MAX_CONNECTIONS)
    if cap and _state["sockets"] + _state["extra"] >= cap:
        return "server"
    return None


def lane_started(running_before: int, client: ClientLanes | None = None) -> None:
    if running_before >= 1:
        _state["extra"] += 1
        if client is not None:
            client.lane_started()


def lane_ended(running_before: int, client: ClientLanes | None = None) -> None:
    if running_before >= 2:
        _state["extra"] -= 1
        if client is not None:
            client.lane_ended()
