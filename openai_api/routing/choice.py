"""Which replica takes a request: a pure function of the replicas, their loads and the
request's keys, so that every gateway process makes the same choice for the same request
without asking another.

Cache-aware order: the replica that served the conversation before (affinity), else the
first replica clockwise from the prefix key's hash on a ring of the replicas (consistent
hashing), else the fewest outstanding. Affinity and the ring skip a replica already at the
load bound, ceil((1 + ε) * (outstanding + 1) / replicas) (consistent hashing with bounded loads,
Mirrokni, Thorup and Zadimoghaddam 2016): a hot prefix fills its replica to the bound, then
spills to the next on the ring, and no replica carries more than the bound while another
has room. A replica added or removed moves only the keys whose first ring point was its.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

Reason = Literal["cache", "affinity", "prefix", "load", "round-robin"]
POLICIES: Final = ("cache-aware", "least-outstanding", "round-robin")
# Points per replica on the ring: with 3 replicas, each owns 33 % ± ~5 % of the keys.
POINTS: Final = 160


def point(text: str) -> int:
    """A place on the ring, the same in every process and release (not Python's hash)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=512)
def ring(urls: frozenset[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The ring of these replicas: sorted points and the replica owning each. Keyed by the
    set, so the order a route lists its replicas in does not move a key."""
    points = sorted((point(f"{url}#{i}"), url) for url in urls for i in range(POINTS))
    return tuple(p for p, _ in points), tuple(u for _, u in points)


def bound(loads: Mapping[str, int], urls: tuple[str, ...], epsilon: float, floor: int = 1) -> int:
    """The most requests a replica may hold with this one placed: never below `floor`, the
    engine's batch size (it serves that many at once without one waiting for another)."""
    total = sum(loads.get(url, 0) for url in urls) + 1
    return max(1, floor, math.ceil((1 + epsilon) * total / len(urls)))


def on_ring(key: str, urls: tuple[str, ...], loads: Mapping[str, int], cap: int) -> str | None:
    """The first replica clockwise from `key` with room under `cap`, None when all are full."""
    points, owners = ring(frozenset(urls))
    start = bisect.bisect_left(points, point(key))
    seen: set[str] = set()
    for i in range(len(points)):
        url = owners[(start + i) % len(points)]
        if url in seen:
            continue
        if loads.get(url, 0) < cap:
            return url
        seen.add(url)
        if len(seen) == len(urls):
            break
    return None


def home(key: str | None, urls: tuple[str, ...]) -> str | None:
    """The key's own replica: where it goes while no replica is at the bound."""
    if not key:
        return None
    points, owners = ring(frozenset(urls))
    return owners[bisect.bisect_left(points, point(key)) % len(points)]


def fewest(urls: tuple[str, ...], loads: Mapping[str, int]) -> str:
    """The replica with the fewest outstanding (the first listed among equals)."""
    return min(urls, key=lambda url: loads.get(url, 0))


def choose(
    urls: tuple[str, ...],
    loads: Mapping[str, int],
    *,
    policy: str = "cache-aware",
    affine: str | None = None,
    prefix: str | None = None,
    epsilon: float = 0.25,
    turn: int = 0,
    floor: int = 1,
) -> tuple[str, Reason]:
    """The replica for one request and why. `affine`: the replica that served the request's
    conversation before (ignored when no longer among `urls`: gone or draining); `prefix`:
    the request's prefix key; `turn`: a counter for round robin; `floor`: the engine's
    batch size, the least the load bound is."""
    if not urls:
        raise ValueError("no replica to choose from")
    if policy == "round-robin":
        return urls[turn % len(urls)], "round-robin"
    if policy == "cache-aware":
        cap = bound(loads, urls, epsilon, floor)
        if affine is not None and affine in urls and loads.get(affine, 0) < cap:
            return affine, "affinity"
        if prefix:
            found = on_ring(prefix, urls, loads, cap)
            if found is not None:
                return found, "prefix"
    return fewest(urls, loads), "load"
