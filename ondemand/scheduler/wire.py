"""What the gateways and the scheduler's owner say to each other: one JSON object a line over
a stream (a Unix socket on the host, TCP from a `--gateway-only` host), after a handshake.

The handshake proves each side knows the site's secret without sending it: the owner sends a
fresh nonce, the gateway answers with its own nonce and HMAC-SHA256(key, "gateway" + both),
the owner answers HMAC-SHA256(key, "owner" + both); the key is derived from SECRET_KEY (which
every process of a site shares already: sessions and signed values need it). Each proof
covers both nonces and names its side, so neither can be replayed or reflected: a process
that took the owner's address while it restarted learns nothing it can use and is refused.
A peer that fails is closed before anything it sends is read as an operation. The stream is
not encrypted: a TCP link belongs on the site's private network (README).

Lines are bounded (MAX_LINE): a peer cannot make the other side buffer without end.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from django.conf import settings

MAX_LINE = 1 << 20  # one message; a view with its URLs is well under a kilobyte
HANDSHAKE_S = 5.0


class WireError(Exception):
    """The peer broke the protocol (or the link): the link is closed."""


@dataclass(frozen=True)
class Address:
    """Where the owner listens: a Unix socket's path, or a TCP host and port."""

    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.path else f"tcp://{self.host}:{self.port}"


def parse(url: str) -> Address:
    """`unix:/path/to/socket` or `tcp://host:port`; ValueError with the reason otherwise."""
    if url.startswith("unix:"):
        path = url.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"a scheduler's Unix socket is an absolute path, not {path!r}")
        return Address(path=path)
    if url.startswith("tcp://"):
        host, sep, port = url.removeprefix("tcp://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a scheduler's TCP address is tcp://host:port, not {url!r}")
        return Address(host=host.strip("[]"), port=int(port))
    raise ValueError(f"a scheduler's address starts with unix: or tcp://, not {url!r}")


def site_key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode(), b"modelship-scheduler", hashlib.sha256).digest()


def proof(side: str, owners: str, gateways: str) -> str:
    """`side` ("gateway" or "owner") proves it knows the key for this pair of nonces."""
    said = f"{side}\n{owners}\n{gateways}".encode()
    return hmac.new(site_key(), said, hashlib.sha256).hexdigest()


def fresh_nonce() -> str:
    return secrets.token_hex(16)


def proves(side: str, owners: str, gateways: object, answer: object) -> bool:
    if not isinstance(gateways, str) or not isinstance(answer, str) or len(gateways) > 64:
        return False
    return hmac.compare_digest(proof(side, owners, gateways), answer)


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


async def read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message; None at the end of the stream. WireError for a line that is too
    long or not a JSON object."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise WireError("the link ended inside a message") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise WireError("a message longer than the limit") from exc
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise WireError("a message that is not JSON") from exc
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message


async def open_link(address: Address) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.path:
        return await asyncio.open_unix_connection(address.path, limit=MAX_LINE)
    reader, writer = await asyncio.open_connection(address.host, address.port, limit=MAX_LINE)
    keep_alive(writer.get_extra_info("socket"))
    return reader, writer


def keep_alive(sock: socket.socket | None) -> None:
    """A TCP link whose other host vanished (no reset) is found dead in about 20 s, not the
    kernel's 2 hours: what the gateway held is freed, what it asked is asked again."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
