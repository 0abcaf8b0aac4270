"""A request's replica and slot, chosen by the scheduler's owner over the site's outstanding
requests and its one table of slots (openai_api/routing/), for the request's hint; held
until the block ends. While no owner answers, this process's own counts choose the replica
and no slot is pinned (the engine places the request itself)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, cast, get_args

from ondemand.scheduler.client import Link, unavailable
from openai_api import access
from openai_api.dispatch import Replica, dispatcher
from openai_api.errors import GatewayError
from openai_api.routing import hints, slots

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def pinned_of(chosen: dict[str, Any], count: int) -> slots.Pinned:
    """The slot the owner pinned the request to, as it said it (unpinned where it said
    something else)."""
    slot, cache, blocks = chosen.get("slot"), chosen.get("cache"), chosen.get("blocks")
    if type(slot) is not int or not 0 <= slot < count or cache not in get_args(slots.Cache):
        return slots.Pinned()
    return slots.Pinned(slot, cast("slots.Cache", cache), blocks if type(blocks) is int else 0)


@contextlib.asynccontextmanager
async def replica(to: Link, urls: tuple[str, ...], deployment: str) -> AsyncIterator[str]:
    """One of the replicas (and its slot), as the owner chose them."""
    hint = hints.current.get()
    asked: dict[str, Any] = {"op": "replica", "urls": list(urls), "deployment": deployment}
    asked["hint"] = None if hint is None else asdict(hint)
    ask = to.new_ask(asked)
    try:
        chosen = await to.answer(ask)
    except GatewayError as exc:
        if exc.code != "scheduler_unavailable":
            raise
        # No owner now: this process's own counts choose, rather than a 503 for a request
        # that any replica can serve; its slots are the owner's to choose (the engine places
        # this request itself, and no ledger is written here).
        if hint is not None and hint.slots:
            hints.current.set(replace(hint, slots=0))
        async with Replica(dispatcher.router, urls, deployment) as url:
            yield url
        return
    url = str(chosen.get("url"))
    if url not in urls:
        to.release(ask.id)
        raise unavailable("it chose a replica the route does not have")
    record = access.current.get()
    if record is not None and len(urls) > 1:
        record.replica, record.routed_by = urls.index(url), str(chosen.get("routed_by", ""))
    held: dict[str, Any] = {"kind": "replica", "url": url}
    if hint is not None and hint.slots:
        pin = pinned_of(chosen, hint.slots)
        slots.note(pin)
        held["slot"] = pin.slot
    to.hold(ask, held)
    failed = True
    try:
        yield url
        failed = not slots.served()
    finally:
        to.release(ask.id, failed=failed and "slot" in held)
