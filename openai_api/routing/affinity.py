"""Which replica served a conversation: a bounded table in each gateway process, shared
through Redis where REDIS_URL is set (openai_api/routing/shared.py writes it there and
reads what this process has not seen)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Final

# At ~200 bytes an entry, ~40 MB at most: the oldest go first.
MAX_ENTRIES: Final = 200_000


class Affinity:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.lock = threading.Lock()
        self.entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # Written here, not yet in Redis: (key, replica), taken by the sync thread.
        self.unshared: list[tuple[str, str]] = []

    def get(self, key: str) -> str | None:
        with self.lock:
            found = self.entries.get(key)
            if found is None:
                return None
            if found[1] < time.monotonic():
                del self.entries[key]
                return None
            return found[0]

    def put(self, key: str, url: str, ttl_s: float, *, share: bool = True) -> None:
        if ttl_s <= 0:
            return
        with self.lock:
            self.entries[key] = (url, time.monotonic() + ttl_s)
            self.entries.move_to_end(key)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
            if share:
                self.unshared.append((key, url))
                del self.unshared[: -self.max_entries]

    def take_unshared(self) -> list[tuple[str, str]]:
        with self.lock:
            taken, self.unshared = self.unshared, []
        return taken

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.unshared.clear()
