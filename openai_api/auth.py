"""Who is calling: API keys (Bearer or x-api-key), identities, rate limits."""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import math
import time
from collections import deque
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone

from common.db_calls import off_loop
from common.networks import Network, networks
from openai_api.errors import GatewayError
from openai_api.limit_headers import WINDOW_S, Left, requests_headers
from openai_api.models import KEY_PREFIX, ApiKey, hash_secret

if TYPE_CHECKING:
    from openai_api.catalog import Key, Snapshot

LAST_USED_EVERY_S = 60.0
# Compared against when the prefix is unknown, so a miss costs what a hit costs.
_DUMMY_HASH = hash_secret("not a key")


@dataclass(frozen=True)
class Caller:
    key: Key | None
    identity: str


def presented_key(headers: dict[str, str]) -> str | None:
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return headers.get("x-api-key") or None


def invalid(message: str = "Incorrect API key provided.") -> GatewayError:
    return GatewayError(401, message, "invalid_api_key")


MAX_IDENTITY_CHARS = 128


def trusted_identity(headers: dict[str, str], peer: str) -> str:
    """The caller a trusted proxy names in MSHIP_TRUSTED_IDENTITY_HEADER, namespaced apart
    from key identities; "" when the header is not set up, absent, or sent by a peer outside
    MSHIP_TRUSTED_PROXY_CIDRS (anyone can send a header)."""
    name = settings.MSHIP_TRUSTED_IDENTITY_HEADER
    value = headers.get(name, "").strip() if name else ""
    if not value or not from_trusted_proxy(peer):
        return ""
    if len(value) > MAX_IDENTITY_CHARS or not value.isprintable():
        raise GatewayError(
            400,
            f"The {name} header must be printable and at most {MAX_IDENTITY_CHARS} characters.",
            "invalid_identity",
        )
    return f"user:{value}"


def from_trusted_proxy(peer: str) -> bool:
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in trusted_proxies())


@functools.cache
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return networks(cidrs)


def trusted_proxies() -> tuple[Network, ...]:
    return _networks(tuple(settings.MSHIP_TRUSTED_PROXY_CIDRS))


# The key the request in this context came with (None: no key): its class orders the queues
# (common/priority.py), its max_concurrency bounds it (openai_api/concurrency.py). Set by
# `authenticate`.
current_key: ContextVar[Key | None] = ContextVar("modelship_current_key", default=None)


def authenticate(snapshot: Snapshot, headers: dict[str, str], peer: str = "") -> Caller:
    if not settings.MSHIP_AUTH:
        return Caller(None, trusted_identity(headers, peer) or "anonymous")
    raw = presented_key(headers)
    if raw is None:
        raise invalid("You didn't provide an API key (Authorization: Bearer or x-api-key).")
    marker, _, rest = raw.partition("-")
    prefix, _, secret = rest.partition("-")
    key = snapshot.keys.get(prefix) if marker == KEY_PREFIX else None
    if key is None or _verified.get(raw) != key.secret_hash:
        expected = key.secret_hash if key is not None else _DUMMY_HASH
        if not hmac.compare_digest(hash_secret(secret), expected) or key is None:
            raise invalid()
        remember(raw, key.secret_hash)
    if key.revoked:
        raise invalid("This API key has been revoked.")
    current_key.set(key)
    return Caller(key, trusted_identity(headers, peer) or f"key:{key.id}")


# Keys verified before -> the hash they matched, so a known key skips the hash. Checked against
# the current table's hash each time: a key whose secret changed, or that is gone, is hashed
# again; revocation is read from the table, never from here.
_verified: dict[str, str] = {}
VERIFIED_KEYS = 4096


def remember(raw: str, secret_hash: str) -> None:
    if len(_verified) >= VERIFIED_KEYS:
        _verified.clear()  # rare (that many distinct keys in use): start over, not an LRU
    _verified[raw] = secret_hash


def too_many(limit: int, retry_s: int) -> GatewayError:
    """A key over its requests per minute: when to try again, and the window's
    x-ratelimit-*-requests headers (nothing left), as every answer of the key says them."""
    said = requests_headers(Left(limit, 0, float(retry_s)))
    return GatewayError(
        429,
        f"Rate limit reached: {limit} requests per minute for this key.",
        "rate_limit_exceeded",
        {"retry-after": str(retry_s), **{k.decode(): v.decode() for k, v in said}},
    )


class RateLimiter:
    """Requests per minute per key, in this process: a sliding window of arrival times
    (rate_limits.py holds them across processes)."""

    def __init__(self) -> None:
        self.arrivals: dict[int, deque[float]] = {}

    def check(self, key: Key) -> Left | None:
        """The key's arrival (429 past its limit) and what its window has left; None: it has
        no limit."""
        limit = key.requests_per_minute or settings.MSHIP_DEFAULT_RPM
        if not limit:
            return None
        return self.left(key.id, limit, self.admit(key.id, limit))

    def admit(self, key_id: int, limit: int) -> int:
        """One arrival of the key, or 429 when `limit` arrived in the last minute. Returns
        the arrivals in the window, this one included."""
        now = time.monotonic()
        window = self.window(key_id, now)
        if len(window) >= limit:
            raise too_many(limit, max(1, math.ceil(60.0 - (now - window[0]))))
        window.append(now)
        return len(window)

    def note(self, key_id: int, limit: int) -> int:
        """An arrival let in elsewhere (another process, on its own): counted, never refused;
        the window keeps at most `limit`. Returns the arrivals in the window."""
        now = time.monotonic()
        window = self.window(key_id, now)
        window.append(now)
        while len(window) > limit:
            window.popleft()
        return len(window)

    def left(self, key_id: int, limit: int, arrivals: int) -> Left:
        """What the key's window has left after `arrivals` (admit's or note's count), and
        when its oldest arrival leaves it."""
        now = time.monotonic()
        window = self.arrivals.get(key_id)
        oldest = window[0] if window else now
        return Left(limit, max(0, limit - arrivals), max(0.0, WINDOW_S - (now - oldest)))

    def window(self, key_id: int, now: float) -> deque[float]:
        window = self.arrivals.setdefault(key_id, deque())
        while window and now - window[0] >= 60.0:
            window.popleft()
        return window


class LastUsed:
    """Records a key's last use at most once a minute, off the request's path."""

    def __init__(self) -> None:
        self.written: dict[int, float] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def touch(self, key: Key) -> None:
        now = time.monotonic()
        if now - self.written.get(key.id, -LAST_USED_EVERY_S) < LAST_USED_EVERY_S:
            return
        self.written[key.id] = now
        task = asyncio.create_task(off_loop(_write_last_used, key.id))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _write_last_used(key_id: int) -> None:
    ApiKey.objects.filter(pk=key_id).update(last_used=timezone.now())


last_used = LastUsed()
