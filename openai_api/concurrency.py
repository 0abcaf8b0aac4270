"""max_concurrency: at most so many requests at once on a deployment and on a key, on the
whole site; the rest wait their turn, fairly, or get 429 (MSHIP_CONCURRENCY_OVERFLOW).

A freed place goes to the waiting request that ranks highest: its class (the key's plus the
deployment's, common/priority.py), aged one class per MSHIP_PRIORITY_AGING_S; among equals,
the one whose key has had the fewest places (keys take turns: a key's burst of a thousand
goes one by one beside another key's single request, which waits one turn, not a thousand);
then the first to arrive. A key that starts to wait joins the round just ahead of the keys
waiting already (start-time fair queuing): it has the next turn, and a late burst does not
go before all of them.

A request that fits goes at once unless a request it competes with (the same deployment, the
same key) waits before it; at most MSHIP_ONDEMAND_MAX_QUEUED wait per deployment, and at most
MSHIP_MAX_WAITING_PER_KEY of one key. Where a deployment's list is full, the key that holds the
most of its places gives up its latest (429), not the newcomer of another key: one key's
burst cannot shut every other key out.

The engine queues what it is sent in arrival order: only a limit held here, where the keys
are known, can be fair between them. One `Limits` holds the site's places: the gateway's own
where it is the only process, else the scheduler's owner's (ondemand/scheduler/), which each
gateway asks with the request's `Claim`. A request with no limit on its way costs one lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.conf import settings

from common import metrics, priority
from openai_api import wait_status
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from openai_api.catalog import Key, Route

RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Claim:
    """What a request asks of the limits: all they read of its route and key (it travels to
    the scheduler's owner as it is)."""

    deployment_id: int
    deployment: str
    deployment_cap: int | None
    key_id: int | None
    key_cap: int | None
    priority: int

    @classmethod
    def of(cls, route: Route, key: Key | None) -> Claim:
        return cls(
            route.deployment_id,
            route.name,
            route.max_concurrency,
            None if key is None else key.id,
            None if key is None else key.max_concurrency,
            route.priority + (0 if key is None else key.priority),
        )


@dataclass
class Ticket:
    """One request waiting for a place, with the limits it must fit."""

    deployment_id: int
    deployment_cap: int | None
    key_id: int | None
    key_cap: int | None
    priority: int
    arrived: float
    granted: asyncio.Future[None] = field(repr=False)
    deployment: str = ""

    @classmethod
    def of(cls, claim: Claim) -> Ticket:
        return cls(
            claim.deployment_id,
            claim.deployment_cap,
            claim.key_id,
            claim.key_cap,
            claim.priority,
            time.monotonic(),
            asyncio.get_running_loop().create_future(),
            claim.deployment,
        )

    def got_place(self) -> bool:
        """Its place was granted (not refused while it waited, nor never decided)."""
        granted = self.granted
        return granted.done() and not granted.cancelled() and granted.exception() is None


def turn(
    waiting: list[Ticket], admissible: list[Ticket], turns: dict[int | None, int], now: float
) -> Ticket:
    """The admissible ticket that goes next (the module's docstring says the order);
    `waiting` gives the arrival order, `turns` the places each key had (None: no key)."""
    arrival = {id(t): n for n, t in enumerate(waiting)}
    aging = float(settings.MSHIP_PRIORITY_AGING_S)

    def order(t: Ticket) -> tuple[float, int, int]:
        had = turns.get(t.key_id, 0)
        return (-priority.rank(t.priority, now - t.arrived, aging), had, arrival[id(t)])

    return min(admissible, key=order)


def key_waits_too_much(cap: int) -> GatewayError:
    """One key's share of a wait list is full: the other keys' requests still wait their
    turn (the on-demand queue says the same: ondemand/errors.py)."""
    return GatewayError(
        429,
        f"This API key has {cap} requests waiting already, the most one key may"
        " (MSHIP_MAX_WAITING_PER_KEY). Try again shortly.",
        "too_many_waiting_requests",
        {"retry-after": "5"},
    )


class Waits(Protocol):
    key_id: int | None
    arrived: float


W = TypeVar("W", bound=Waits)


def giving_way(waiting: Sequence[W], key_id: int | None) -> W | None:
    """Of a full wait list, the request that gives its place to a newcomer of `key_id`: the
    latest of the key holding the most places, where it holds more than the newcomer's key
    would with it (None: the newcomer is refused, as a full list's are)."""
    held: dict[int | None, list[W]] = {}
    for waiter in waiting:
        held.setdefault(waiter.key_id, []).append(waiter)
    # Requests of no key (LiteLLM's /ondemand, a gateway without keys) are no one tenant:
    # never the ones that give way.
    keyed = [found for key, found in held.items() if key is not None]
    heaviest = max(keyed, key=len, default=[])
    if len(heaviest) <= len(held.get(key_id, ())) + 1 or heaviest[0].key_id == key_id:
        return None
    # Its latest (the last to come among equal times): the one its key would send last.
    return heaviest[max(range(len(heaviest)), key=lambda n: (heaviest[n].arrived, n))]


def gives_way(deployment: str) -> GatewayError:
    """A waiting request of the key holding the most places of a full list, refused so that
    another key's request may wait."""
    return GatewayError(
        429,
        f"The wait list of {deployment} is full and this API key holds the most places in it:"
        " its latest request gives its place to another key's. Try again shortly.",
        "too_many_waiting_requests",
        {"retry-after": "5"},
    )


def too_many(claim: Claim, keys_own: bool) -> GatewayError:
    if keys_own and claim.key_id is not None:
        said = f"This API key has {claim.key_cap} requests in flight, the most it may."
    elif claim.deployment_cap is not None:
        said = (
            f"{claim.deployment} has {claim.deployment_cap} requests in flight, the most it takes."
        )
    else:
        said = "Too many requests wait for a place on this model."
    return GatewayError(
        429,
        f"{said} Try again shortly.",
        "too_many_concurrent_requests",
        {"retry-after": str(RETRY_AFTER_S)},
    )


class Limits:
    """This process's counts and waiting requests (one event loop serves them)."""

    def __init__(self) -> None:
        self.by_deployment: dict[int, int] = {}
        self.by_key: dict[int, int] = {}
        self.waiting: list[Ticket] = []
        self.turns: dict[int | None, int] = {}  # places each key had in this round
        self.version = 0  # raised when the waiting list changes (the places' cache)
        self._places: tuple[int, dict[int, int]] = (-1, {})

    @staticmethod
    def binds(route: Route, key: Key | None) -> bool:
        return route.max_concurrency is not None or (
            key is not None and key.max_concurrency is not None
        )

    def _fits(self, t: Ticket) -> bool:
        if t.deployment_cap is not None and (
            self.by_deployment.get(t.deployment_id, 0) >= t.deployment_cap
        ):
            return False
        return t.key_id is None or t.key_cap is None or self.by_key.get(t.key_id, 0) < t.key_cap

    def _take(self, t: Ticket) -> None:
        self.turns[t.key_id] = self.turns.get(t.key_id, 0) + 1
        self.by_deployment[t.deployment_id] = self.by_deployment.get(t.deployment_id, 0) + 1
        if t.key_id is not None:
            self.by_key[t.key_id] = self.by_key.get(t.key_id, 0) + 1

    def _give_back(self, t: Ticket) -> None:
        self.by_deployment[t.deployment_id] -= 1
        if not self.by_deployment[t.deployment_id]:
            del self.by_deployment[t.deployment_id]
        if t.key_id is not None:
            self.by_key[t.key_id] -= 1
            if not self.by_key[t.key_id]:
                del self.by_key[t.key_id]

    @contextlib.asynccontextmanager
    async def held(self, route: Route, key: Key | None) -> AsyncIterator[None]:
        """A place for one request on the route with the key, held while the block runs."""
        ticket = await self.enter(Claim.of(route, key))
        try:
            yield
        finally:
            self.leave(ticket)

    async def enter(self, claim: Claim) -> Ticket:
        """A place for the claim: at once, or after its turn came (429 where it may not
        wait); `leave` gives it back."""
        ticket = Ticket.of(claim)
        if self._fits(ticket) and not self._competes(ticket):
            if not self.waiting:
                self.turns.clear()  # nobody waits: a new round of turns begins
            self._take(ticket)
        else:
            await self._wait(ticket, claim)
        return ticket

    def adopt(self, claim: Claim) -> Ticket:
        """A place a gateway held before this process began to own the places (it says so
        as it connects): counted at once, whatever the limit says now."""
        ticket = Ticket.of(claim)
        self._take(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        self._give_back(ticket)
        self._admit()

    def _competes(self, ticket: Ticket) -> bool:
        """A request waits already for what this one would take: its deployment's limit or
        its key's."""
        return any(
            (ticket.deployment_cap is not None and t.deployment_id == ticket.deployment_id)
            or (ticket.key_cap is not None and t.key_id == ticket.key_id)
            for t in self.waiting
        )

    async def _wait(self, ticket: Ticket, claim: Claim) -> None:
        keys_own = ticket.key_cap is not None and (
            self.by_key.get(ticket.key_id or 0, 0) >= ticket.key_cap
        )
        if settings.MSHIP_CONCURRENCY_OVERFLOW == "reject":
            raise too_many(claim, keys_own)
        # Its key's share first: a request refused anyway never takes another's place.
        per_key = int(settings.MSHIP_MAX_WAITING_PER_KEY)
        mine = sum(t.key_id == ticket.key_id for t in self.waiting)
        if ticket.key_id is not None and 0 < per_key <= mine:
            raise key_waits_too_much(per_key)
        same = [t for t in self.waiting if t.deployment_id == ticket.deployment_id]
        if len(same) >= int(settings.MSHIP_ONDEMAND_MAX_QUEUED) and not self._make_way(
            ticket, same
        ):
            raise too_many(claim, keys_own)
        if ticket.key_id not in self.turns:
            # Joins the round just ahead of the waiting keys (the next turn is its own), not
            # at nought, where a late burst would go before all of them.
            waiting_keys = {t.key_id for t in self.waiting}
            least = min((self.turns.get(k, 0) for k in waiting_keys), default=0)
            self.turns[ticket.key_id] = max(0, least - 1)
        self.waiting.append(ticket)
        self.version += 1
        wait_status.follow(lambda: self.figures_of(ticket))
        self._admit()  # a place may be free: only others waited before it
        try:
            async with asyncio.timeout(settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S):
                await asyncio.shield(ticket.granted)
            waited = time.monotonic() - ticket.arrived
            metrics.queue_wait.labels(priority.label(ticket.priority)).observe(waited)
        except TimeoutError:
            self._abandon(ticket)
            raise too_many(claim, keys_own) from None
        except BaseException:
            self._abandon(ticket)
            raise

    def _make_way(self, ticket: Ticket, same: list[Ticket]) -> bool:
        """A full list makes way for `ticket` where another key holds more of its places
        than the newcomer's would with it: that key's latest request is refused."""
        victim = giving_way(same, ticket.key_id)
        if victim is None:
            return False
        self.waiting.remove(victim)
        self.version += 1
        victim.granted.set_exception(gives_way(victim.deployment or "this model"))
        return True

    def figures_of(self, ticket: Ticket) -> dict[str, Any] | None:
        """Its place among those waiting for the same deployment, in the order they would go
        if nothing changed (the keys' turns as they stand: an estimate). One sort of the
        waiting list per change of it, however many streams ask."""
        if self._places[0] != self.version:
            now, aging = time.monotonic(), float(settings.MSHIP_PRIORITY_AGING_S)
            arrival = {id(t): n for n, t in enumerate(self.waiting)}

            def order(t: Ticket) -> tuple[float, int, int]:
                had = self.turns.get(t.key_id, 0)
                return (-priority.rank(t.priority, now - t.arrived, aging), had, arrival[id(t)])

            places: dict[int, int] = {}
            seen: dict[int, int] = {}
            for t in sorted(self.waiting, key=order):
                seen[t.deployment_id] = seen.get(t.deployment_id, 0) + 1
                places[id(t)] = seen[t.deployment_id]
            self._places = (self.version, places)
        place = self._places[1].get(id(ticket))
        return None if place is None else {"waiting_for": "a place", "position": place}

    def _abandon(self, ticket: Ticket) -> None:
        """A waiting request gave up: its ticket leaves, or its place goes on if it had one."""
        if ticket in self.waiting:
            self.waiting.remove(ticket)
            self.version += 1
        elif ticket.got_place():
            self._give_back(ticket)
            self._admit()

    def _admit(self) -> None:
        """Grant places to waiting requests while any fits."""
        now = time.monotonic()
        while self.waiting:
            admissible = [t for t in self.waiting if self._fits(t)]
            if not admissible:
                return
            ticket = turn(self.waiting, admissible, self.turns, now)
            self.waiting.remove(ticket)
            self.version += 1
            self._take(ticket)
            ticket.granted.set_result(None)


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Limits] = weakref.WeakKeyDictionary()


def limits() -> Limits:
    """This event loop's (its waiting requests' futures belong to it)."""
    loop = asyncio.get_running_loop()
    if loop not in _by_loop:
        _by_loop[loop] = Limits()
    return _by_loop[loop]
