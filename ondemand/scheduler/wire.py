"""What the gateways and the scheduler's owner say to each other: one JSON object a line over
a stream (a Unix socket on the host, TCP from a `--gateway-only` host), after a handshake.

The handshake proves the gateway knows the site's secret without sending it: the owner sends
a fresh nonce, the gateway answers HMAC-SHA256(key, nonce), where the key is derived from
SECRET_KEY (which every process of a site shares already: sessions and signed values need
it). A peer that fails it is closed before anything it sends is read as an operation. The
stream is not encrypted: a TCP link belongs on the site's private network (README).

Lines are bounded (MAX_LINE): a peer cannot make the other side buffer without end.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
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


def proof(nonce: str) -> str:
    return hmac.new(site_key(), nonce.encode(), hashlib.sha256).hexdigest()


def fresh_nonce() -> str:
    return secrets.token_hex(16)


def proves(nonce: str, answer: object) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(proof(nonce), answer)


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
    return await asyncio.open_connection(address.host, address.port, limit=MAX_LINE)
