"""The on-demand gateway's checks after the peer guard, as the on-demand seed orders them:
a clean path, a configured key, the failed-attempt limit per peer, then the key itself."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

from common.secret_files import create_secret
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

log = logging.getLogger(__name__)

KEY_CHECK_S = 1.0  # the key file is looked at no more often than this
PREVIOUS_KEY_GRACE_S = 300.0
FAILURES_PER_MINUTE = 20

# A scope's key, set by the server (modelship_site/server.py): the request target ends in a
# lone `?`, which ASGI's empty query_string cannot tell from none.
BARE_QUERY = "modelship.bare_query"
# Encoded /, \, #, ? and NUL: a segment must not smuggle a separator past the split.
_ENCODED = re.compile(r"%(2f|5c|23|3f|00)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def checked_segments(raw_path: bytes, bare_query: bool = False) -> list[str]:
    """The path's segments after /ondemand/, or 400 invalid_path (a `?` with no query after
    it, which the server marks, included)."""
    raw = raw_path.decode("latin-1")
    invalid = GatewayError(400, "The request path is not a clean path.", "invalid_path")
    if bare_query or _ENCODED.search(raw) or any(c in raw for c in "\\?#"):
        raise invalid
    try:
        decoded = unquote(raw, errors="strict")
    except UnicodeDecodeError as exc:
        raise invalid from exc
    if _CONTROL.search(decoded) or any(c in decoded for c in "\\?#"):
        raise invalid
    segments = decoded.split("/")[2:]  # "", "ondemand", ...
    if any(s in ("", ".", "..") for s in segments):
        raise invalid
    return segments


@dataclass(frozen=True)
class _Stamp:
    inode: int
    mtime_ns: int
    size: int


class KeyFile:
    """The on-demand key, read from a file and re-read when the file changes (inode, mtime
    or size), at most once a second. A missing or empty file fails closed."""

    def __init__(self, path: Callable[[], Path], clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.clock = clock
        self.key: bytes | None = None
        self.previous: bytes | None = None
        self.previous_until = float("-inf")
        self.stamp: _Stamp | None = None
        self.checked_at = float("-inf")
        self.said_missing = False
        # Called after the key changed (the failed-attempt counts are cleared; a LiteLLM
        # sync registers the new key).
        self.on_change: list[Callable[[], None]] = []

    def current(self) -> bytes | None:
        now = self.clock()
        if now - self.checked_at >= KEY_CHECK_S:
            self.checked_at = now
            # One stat a second, and a read only when it changed: cheap enough for the loop.
            self._check(now)
        return self.key

    def _check(self, now: float) -> None:
        path = self.path()
        try:
            st = os.stat(path)
            stamp = _Stamp(st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self.stamp:
                return
            key = path.read_bytes().strip() or None
        except OSError:
            stamp, key = None, None
        self.stamp = stamp
        # Said once while it lasts, also when the file was never there.
        if key is None and not self.said_missing:
            log.error("the on-demand key file %s is missing or empty: /ondemand answers 503", path)
            self.said_missing = True
        elif key is not None:
            self.said_missing = False
        if key == self.key:
            return
        if self.key is not None:
            self.previous, self.previous_until = self.key, now + PREVIOUS_KEY_GRACE_S
        self.key = key
        for listener in list(self.on_change):
            listener()

    def is_previous(self, offered: bytes) -> bool:
        return (
            self.previous is not None
            and self.clock() < self.previous_until
            and hmac.compare_digest(offered, self.previous)
        )

    def fingerprint(self) -> str | None:
        """The first 12 hex digits of the key's SHA-256 (what LiteLLM's entries carry)."""
        key = self.current()
        return hashlib.sha256(key).hexdigest()[:12] if key else None


class FailedAttempts:
    """Failed key checks per peer, in windows of a minute from the first failure."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.windows: dict[str, tuple[float, int]] = {}

    def check(self, peer: str) -> None:
        started, count = self.windows.get(peer, (0.0, 0))
        if count >= FAILURES_PER_MINUTE and self.clock() - started < 60:
            raise GatewayError(
                429,
                "Too many failed key checks from this address; try again in a minute.",
                "rate_limited",
                {"retry-after": "60"},
            )

    def failed(self, peer: str) -> None:
        now = self.clock()
        started, count = self.windows.get(peer, (now, 0))
        if now - started >= 60:
            started, count = now, 0
        self.windows[peer] = (started, count + 1)
        if len(self.windows) > 10_000:  # old windows of peers long gone
            self.windows = {p: w for p, w in self.windows.items() if now - w[0] < 60}

    def clear(self) -> None:
        self.windows.clear()


def ensure_key_file(path: Path) -> bool:
    """Make the on-demand key when its file does not exist yet (readable by its owner only);
    True when it was made. An existing file, even empty, is the operator's: left alone."""
    if path.exists():
        return False
    return create_secret(path, "odk-" + secrets.token_urlsafe(32))


def offered_key(headers: dict[str, str]) -> bytes:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" else b""


def check_key(keyfile: KeyFile, failures: FailedAttempts, peer: str, offered: bytes) -> None:
    """Checks 3 to 5: a configured key, the failed-attempt limit, the key."""
    key = keyfile.current()
    if key is None:
        raise GatewayError(
            503, "The on-demand gateway has no key configured.", "ondemand_not_configured"
        )
    failures.check(peer)
    if hmac.compare_digest(offered, key):
        return
    if not keyfile.is_previous(offered):
        failures.failed(peer)  # the previous key during its grace is not an attack
    raise GatewayError(401, "Invalid on-demand key.", "invalid_api_key")
