"""How many responses the Responses WebSockets of this process have under way, for the
server's connection cap.

A socket is one connection, but each lane (a `stream_id`) runs a response of its own, as a
request on a connection of its own would: a caller with one socket and a thousand lanes must
not hold a thousand engine requests while counted as one connection. So a socket may run at
most MSHIP_WS_MAX_LANES lanes at once, and every lane beyond a socket's first counts as one
more connection against MSHIP_MAX_CONNECTIONS: `extra()` is what the server adds to its count
of open connections (modelship_site/server.py), and a lane is refused here when the server is
full by that count.

One event loop per process serves the sockets, so plain integers suffice (no lock).
"""

from __future__ import annotations

from django.conf import settings

_state = {"sockets": 0, "extra": 0}


def extra() -> int:
    """Lanes under way beyond each socket's first: connections the server does not see."""
    return _state["extra"]


def sockets() -> int:
    return _state["sockets"]


def socket_opened() -> None:
    _state["sockets"] += 1


def socket_closed() -> None:
    _state["sockets"] -= 1


def may_open(running: int) -> str | None:
    """Why a socket already running `running` lanes may not start one more; None when it may."""
    per_socket = int(settings.MSHIP_WS_MAX_LANES)
    if per_socket and running >= per_socket:
        return "socket"
    cap = int(settings.MSHIP_MAX_CONNECTIONS)
    if running >= 1 and cap and _state["sockets"] + _state["extra"] >= cap:
        return "server"
    return None


def lane_started(running_before: int) -> None:
    if running_before >= 1:
        _state["extra"] += 1


def lane_ended(running_before: int) -> None:
    if running_before >= 2:
        _state["extra"] -= 1
