"""How deep a parsed JSON value nests, measured without recursion.

Python's JSON decoder recurses: a body nested some thousands deep raises RecursionError
(not the ValueError a parser expects, so it escapes as a 500), and one nested a few hundred
deep parses but recurses again in every walk over it (serializers, redaction, rendering).
A parser measures what it parsed with `nesting_depth` and refuses what nests deeper than
its limit. One pass over the value, with a stack of its own: linear in its size.
"""

from __future__ import annotations

from typing import Any


def nesting_depth(value: Any, stop_above: int | None = None) -> int:
    """The depth of `value`: 0 for a scalar, 1 for a flat list or object. With
    `stop_above`, the walk ends as soon as it goes deeper than that (the caller refuses)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if stop_above is not None and deepest > stop_above:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest
