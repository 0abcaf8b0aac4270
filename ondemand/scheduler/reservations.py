"""The site's token reservations, kept by the scheduler's owner where the site runs several
gateway processes (openai_api/usage/budgets.py).

Each process checks a request's reservation against its own view of what a key and its team
used, then asks here, where every process's requests under way are held: one process's burst
and another's cannot together take more than what is left. A reservation is held until its
request ends (`release`) or its process's link does; a new owner starts with none (the
requests under way then count as they end, as before budgets were reserved).
"""

from __future__ import annotations

import functools
from typing import Any

from ondemand.scheduler import wire
from openai_api.usage.budgets import Owner, cannot_fit

MAX_TOKENS = 2**53
MAX_OWNERS = 2  # a key and its team

held: dict[str, int] = {}  # owner ref: tokens held by requests under way, site-wide


async def reserve(ask_id: str, message: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The reservation a gateway asks for, or its refusal (429 budget_exceeded)."""
    tokens, owners = message.get("tokens"), message.get("owners")
    if type(tokens) is not int or not 0 < tokens <= MAX_TOKENS:
        raise wire.WireError("a reservation's tokens of the wrong type or size")
    if not isinstance(owners, list) or not 0 < len(owners) <= MAX_OWNERS:
        raise wire.WireError("a reservation's owners of the wrong shape")
    checked = [budgeted(owner) for owner in owners]
    for owner, limits in checked:
        for field, period, limit, used in limits:
            held_now = held.get(owner.ref, 0)
            if used + held_now + tokens > limit:
                raise cannot_fit(owner, field, period, limit - used, held_now, tokens)
    refs = [owner.ref for owner, _ in checked]
    for ref in refs:
        held[ref] = held.get(ref, 0) + tokens
    return {}, functools.partial(release, refs, tokens)


def release(refs: list[str], tokens: int) -> None:
    for ref in refs:
        left = held.get(ref, 0) - tokens
        if left > 0:
            held[ref] = left
        else:
            held.pop(ref, None)


def budgeted(said: Any) -> tuple[Owner, list[tuple[str, str, int, float]]]:
    """An owner as a gateway said it: its kind, ref, name and each token budget's field,
    period, limit and what the gateway counts as used."""
    if not isinstance(said, dict):
        raise wire.WireError("a reservation's owner that is not an object")
    kind, ref, name, limits = (said.get(k) for k in ("kind", "ref", "name", "limits"))
    if kind not in ("key", "team") or not isinstance(ref, str) or not isinstance(name, str):
        raise wire.WireError("a reservation's owner of the wrong type")
    if not isinstance(limits, list) or len(limits) > 4:
        raise wire.WireError("a reservation's budgets of the wrong shape")
    found = []
    for item in limits:
        if not (isinstance(item, list) and len(item) == 4):
            raise wire.WireError("a reservation's budget of the wrong shape")
        field, period, limit, used = item
        if not isinstance(field, str) or period not in ("day", "month"):
            raise wire.WireError("a reservation's budget of the wrong type")
        if type(limit) is not int or not isinstance(used, int | float) or isinstance(used, bool):
            raise wire.WireError("a reservation's limit or use of the wrong type")
        found.append((field[:64], period, limit, float(used)))
    return Owner(kind, 0, ref[:64], name[:200], ()), found
