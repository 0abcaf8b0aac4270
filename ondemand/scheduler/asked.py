"""What a gateway asks the scheduler's owner, read and checked: a wrong type is refused on
the link that said it, never failing later in the owner's loop."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ondemand.scheduler import wire
from ondemand.state import View
from openai_api.catalog import Adapter, Route, catalog
from openai_api.concurrency import Claim

if TYPE_CHECKING:
    from openai_api.routing.hints import Hint


def adapter_route(about: dict[str, Any]) -> Route:
    """An adapter's route as runtime_adapters reads it: its name, idle timeout and files."""
    return Route(
        deployment_id=0,
        name=str(about["name"]),
        aliases=(),
        loader="vllm",
        usecase="generate",
        endpoints=frozenset(),
        state="ready",
        on_demand=False,
        urls=(),
        created=0,
        idle_timeout_s=float(about["idle_timeout_s"]),
        adapter=Adapter(**about["adapter"]),
    )


def view_of(fields: dict[str, Any]) -> View:
    """The asking gateway's view of a deployment, from its route table (no query)."""
    return View(
        id=int(fields["id"]),
        name=str(fields["name"]),
        state=str(fields["state"]),
        on_demand=bool(fields["on_demand"]),
        need_gib=0.0,
        idle_timeout_s=float(fields["idle_timeout_s"]),
        urls=tuple(str(url) for url in fields["urls"]),
    )


def rated(message: dict[str, Any]) -> tuple[int, int]:
    """A rate-limited arrival's key and limit as a gateway said them, checked."""
    key, limit = message.get("key"), message.get("limit")
    # No upper bound: a window holds the arrivals of one minute, what was let in, whatever
    # the limit (a key of 10**9 a minute is one an operator made unlimited).
    if type(key) is not int or type(limit) is not int or limit <= 0:
        raise wire.WireError("a rate limit's key or limit of the wrong type")
    return key, limit


def claim_of(fields: Any) -> Claim:
    """A place's claim as a gateway said it, checked: whole numbers where numbers go (a wrong
    type would fail later, in the owner's loop, not in this link's)."""
    if not isinstance(fields, dict):
        raise wire.WireError("a claim that is not an object")
    claim = Claim(**fields)
    numbers = (claim.deployment_id, claim.priority)
    maybe = (claim.deployment_cap, claim.key_id, claim.key_cap)
    if not all(type(n) is int for n in numbers) or not isinstance(claim.deployment, str):
        raise wire.WireError("a claim with a field of the wrong type")
    if not all(n is None or (type(n) is int and n >= 0) for n in maybe):
        raise wire.WireError("a claim with a field of the wrong type")
    return claim


def as_routed(hint: Hint | None, deployment: str) -> Hint | None:
    """A gateway's hint with what the route says of its engine (batch, slots, kept caches)
    as this owner's table has it: two gateways whose tables differ for a moment never make
    it rebuild a replica's slots back and forth."""
    snapshot = catalog.snapshot
    route = snapshot.routes.get(deployment) if snapshot is not None else None
    if hint is None or route is None:
        return hint
    return replace(hint, batch=route.batch, slots=route.slots, keep=route.keeps_cache)
