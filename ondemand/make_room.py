"""Make-room, the controller's half that stops other models for a start: which ones may go
(unused, or by the seed's stricter rule idle for their whole timeout), in what order (the
cheapest to bring back first: policy.keep_cost), never a pinned one or one of a class above
the requester's, and the cap on loaded models (MSHIP_MAX_LOADED_MODELS) counted like memory.

A mixin of the Controller: the same lock, entries and deployer; kept apart for its size."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from common import metrics
from deployments.memory import InsufficientMemory
from deployments.models import State
from ondemand import errors, policy
from ondemand.policy import EPSILON_GIB

if TYPE_CHECKING:
    from collections.abc import Callable

    from ondemand.clock import Clock
    from ondemand.state import Budget, Deployer, Entry, View

SETTLE_S = 20.0  # how long freed memory may take to show, and the does_not_fit grace
LOADED = (State.STARTING, State.READY)  # what the cap on loaded models counts


def loaded_besides(view: View, views: list[View]) -> int:
    """The models loaded (starting or ready) other than the view's, as the caps count."""
    return sum(v.state in LOADED and v.id != view.id for v in views)


class RoomMaking:
    deployer: Deployer
    clock: Clock
    freed_for: dict[int, float]
    last_stop_at: float
    max_loaded: int  # MSHIP_MAX_LOADED_MODELS: 0, no cap
    aging_s: float
    collation_s: float  # MSHIP_COLLATION_S: how long the head waits before models are drained
    draining: dict[int, int]
    evict_unused: bool  # False: only models idle for their whole timeout (the seed's rule)
    entry: Callable[[int], Entry]
    notify: Callable[[], None]
    queue: dict[int, None]

    def head(self) -> int | None:
        """The deployment the memory queue serves next: the one whose best waiting request
        ranks highest (its class, aged: common.priority.rank); the first to arrive of equals."""
        now, best, best_rank = self.clock.now(), None, float("-inf")
        for deployment_id in self.queue:
            rank = self.entry(deployment_id).rank(now, self.aging_s)
            if rank is not None and rank > best_rank:
                best, best_rank = deployment_id, rank
        return best

    async def _may_start(self, view: View) -> bool:
        """A deployment behind the head of the queue starts only within the memory free now
        minus what was freed for the head (and makes no room): that memory is the head's.
        One whose request outranks the head's goes first."""
        head = self.head()
        if head is None or head == view.id:
            return True
        now = self.clock.now()
        mine = self.entry(view.id).rank(now, self.aging_s)
        if mine is not None and mine > (self.entry(head).rank(now, self.aging_s) or 0.0):
            return True
        budget = await self.deployer.budget()
        return policy.admitted(self.freed_for.get(head, 0.0), budget.free_gib, view.need_gib)

    async def _check_cap(self, view: View) -> None:
        """InsufficientMemory (so that make-room runs) when one more loaded model would pass
        the cap on loaded models."""
        if self.max_loaded <= 0:
            return
        loaded = loaded_besides(view, await self.deployer.views())
        if not policy.within_cap(loaded, self.max_loaded, 0):
            raise InsufficientMemory(
                view.name,
                view.need_gib,
                0.0,
                0.0,
                where=f"{loaded} models are loaded, the most MSHIP_MAX_LOADED_MODELS allows",
            )

    def _refuse_what_never_fits(self, view: View, budget: Budget, after_victim: bool) -> None:
        """does_not_fit when the model needs more than on-demand deployments can ever use;
        not within SETTLE_S of an on-demand stop (its memory may still read as used), nor
        after this attempt stopped a victim."""
        settling = self.clock.now() - self.last_stop_at < SETTLE_S
        too_big = view.need_gib > budget.capacity_gib + EPSILON_GIB
        if too_big and not settling and not after_victim:
            raise errors.does_not_fit(view.name, view.need_gib, budget.capacity_gib)

    async def _make_room(self, view: View, after_victim: bool) -> bool:
        """Stop other on-demand deployments, cheapest to bring back first, until the
        shortfall is covered; False (queue) when they cannot cover it. does_not_fit when the
        model needs more than on-demand deployments can ever use."""
        self._refuse_what_never_fits(view, await self.deployer.budget(), after_victim)
        victims = await self._victims(view)
        if victims is None:
            await self._drain_for(view)
            return False
        stopped = 0
        for victim in victims:
            reason = f"Put to sleep to make room for {view.name}"
            if victim.state == State.ASLEEP:  # what it still holds is given back
                reason = f"Stopped (asleep) to make room for {view.name}"
            if await self.deployer.stop(victim.id, self._stoppable, reason, room_for=view.id):
                stopped += 1
                self.draining.pop(victim.id, None)  # swapped out: its requests may start it
                metrics.make_room_stops.labels(victim.name).inc()
                metrics.evictions.labels(victim.name, "make_room").inc()
                self.last_stop_at = self.clock.now()
                self.freed_for[view.id] = self.freed_for.get(view.id, 0.0) + victim.frees_gib
        self.notify()
        if not stopped:
            return False
        # Freed memory may take a moment to show (a driver releasing it).
        deadline = self.clock.now() + SETTLE_S
        while not (await self.deployer.budget()).room_after(view):
            if self.clock.now() >= deadline:
                break
            await self.clock.wait(asyncio.Event(), 1.0)
        return True

    async def _victims(self, view: View) -> list[View] | None:
        views = await self.deployer.views()
        # The budget read after the states: a stop seen ended is freed in it (one read
        # before could count a stopped victim as held, and stop another for the same room).
        budget = await self.deployer.budget()
        if any(v.id == view.id and v.state in (State.STARTING, State.READY) for v in views):
            return []  # started meanwhile by another process: no room to make for it
        # A stop under way (any process's) is room being made already: two processes must
        # not each stop a victim for one start. Each idle timer is learnt, so that a queued
        # request wakes when one runs out, even of a model this process never served.
        for other in views:
            self.entry(other.id).idle_timeout_s = other.idle_timeout_s
        now = self.clock.now()
        candidates = []
        for other in views:
            if other.id != view.id and await self._may_stop(other):
                entry = self.entry(other.id)
                # A sleeper goes first: it serves nothing and holds what it kept.
                asleep = other.state == State.ASLEEP
                idle = asleep or self._still_idle(other)
                cost = policy.keep_cost(idle, other.start_s, entry.uses_at(now), other.need_gib)
                candidates.append((cost, other))
        # Equal costs (all idle past their timeouts, say) go least recently used first.
        candidates.sort(key=lambda pair: self.entry(pair[1].id).idle_since)
        # The ceiling is the start's best request's class, aged: a low request that waited
        # may stop a normal model (it is never starved), a fresh one may not; with no request
        # left (all gave up as this looked), none.
        rank = self.entry(view.id).rank(self.clock.now(), self.aging_s)
        covers = self._covers(view, views, budget)
        return None if rank is None else policy.victims(candidates, covers, rank)

    def _covers(
        self, view: View, views: list[View], budget: Budget
    ) -> Callable[[list[View]], bool]:
        """Whether stopping some models makes room for the view's start: in memory once they
        and the stops under way (any process's: room being made already) release theirs,
        and under the cap on loaded models."""
        stopping = [v for v in views if v.state == State.STOPPING and v.id != view.id]
        loaded = loaded_besides(view, views)

        def covers(stopped: list[View]) -> bool:
            # A sleeper stopped gives back memory, not a loaded model's place.
            unloaded = sum(1 for v in stopped if v.state != State.ASLEEP)
            within = policy.within_cap(loaded, self.max_loaded, unloaded)
            return within and budget.room_after(view, [*stopping, *stopped])

        return covers

    async def _may_stop(self, view: View) -> bool:
        """Stoppable for a start by the rules, and a fresh load sample of the engine agrees
        where it has load gauges (an asleep one runs nothing)."""
        if not self._stoppable(view):
            return False
        if view.state == State.ASLEEP or not view.gauged:
            return True  # nothing to ask the engine: the slots alone decide
        sample = await self.deployer.load(view.id)
        if sample is None:
            return False
        taken_at, load = sample
        return policy.load_is_idle(self.clock.now() - taken_at, load.idle)

    async def _drain_for(self, view: View) -> None:
        """Collation's bound: the requests waiting for a loaded model are served before it is
        swapped out, but once the queue's head has waited MSHIP_COLLATION_S and no unused
        model makes room, the models in use that would (the cheapest first, of its class or
        below) take no new request until they go unused; make-room then stops them."""
        entry = self.entry(view.id)
        now = self.clock.now()
        oldest = min((w.arrived for w in entry.waiters.values()), default=now)
        if self.collation_s <= 0 or now - oldest < self.collation_s:
            return
        views = await self.deployer.views()
        budget = await self.deployer.budget()
        candidates = []
        for other in views:
            if other.id == view.id or other.state != State.READY or not self._drainable(other):
                continue
            uses = self.entry(other.id).uses_at(now)
            candidates.append((policy.keep_cost(False, other.start_s, uses, other.need_gib), other))
        rank = entry.rank(self.clock.now(), self.aging_s)
        if rank is None:
            return  # its requests left while this looked: nothing to drain for
        chosen = policy.victims(candidates, self._covers(view, views, budget), rank)
        for victim in chosen or ():
            if victim.id not in self.draining:
                self.draining[victim.id] = view.id
                metrics.drains.labels(victim.name).inc()

    def _drainable(self, view: View) -> bool:
        """On demand, no mode switch waiting, and no other process's lease on it (what this
        process does not serve, it cannot drain)."""
        entry = self.entry(view.id)
        return (
            view.on_demand
            and view.pending_mode is None
            and not policy.leased_elsewhere(view.lease_until, entry.lease_wall_until)
        )

    def _undrain(self, head: int) -> None:
        """What was drained for `head` takes requests again (it started, or nobody waits)."""
        drained = [victim for victim, for_head in self.draining.items() if for_head == head]
        for victim in drained:
            del self.draining[victim]
        if drained:
            self.notify()

    def _activity(self, view: View) -> policy.Activity:
        entry = self.entry(view.id)
        # A drained model's own waiters do not keep it: they are what it is drained of.
        waiting = entry.waiting and view.id not in self.draining
        return policy.Activity(
            on_demand=view.on_demand,
            state=view.state,
            pending_mode=view.pending_mode,
            busy=bool(entry.inflight or waiting)
            or policy.leased_elsewhere(view.lease_until, entry.lease_wall_until),
            idle_for_s=self.clock.now() - entry.idle_since,
            idle_timeout_s=view.idle_timeout_s,
        )

    def _still_idle(self, view: View) -> bool:
        """Idle by the seed's rules (the reaper's): the part the deployer's precheck
        re-checks on the fresh row, with no await between it and the stop."""
        return policy.is_idle(self._activity(view))

    def _stoppable(self, view: View) -> bool:
        """What make-room's stop re-checks on the fresh row: unused (or idle, by the seed's
        rule where the site keeps it)."""
        activity = self._activity(view)
        if self.evict_unused or view.id in self.draining:  # a drained one goes once unused
            return policy.is_unused(activity)
        return policy.is_idle(activity)
