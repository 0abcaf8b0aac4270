"""Chained hashes (each block's hash covers every block before it): two chains equal at
place k are equal up to it, so their shared run is found by bisection."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


def shared_run(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading blocks two chains share."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[middle - 1] == b[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low
