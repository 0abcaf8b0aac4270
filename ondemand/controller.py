"""The on-demand controller: slots, starts shared by every waiter, the queue in order of
priority (aged), make-room (ondemand/make_room.py) and start-failure backoff, as the
on-demand seed's Controller section and the scheduler's issue say.

It runs in the gateway's event loop and drives a deployer through an async interface, so
that the same state machine serves the real deployer (in threads) and a test's fake one. Its
counters, timers and queue live in memory: nothing is persisted."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from common import metrics, tracing
from common.priority import label as class_label
from deployments.memory import InsufficientMemory
from deployments.models import STARTABLE_STATES, State
from deployments.runtimes import EngineUnreachable
from ondemand import attempts, errors, load_charge, policy
from ondemand.attempts import POLL_S
from ondemand.clock import Clock, SystemClock
from ondemand.make_room import RoomMaking
from ondemand.policy import StartOutcome
from ondemand.state import (
    LEASE_EXTRA_S,
    LEASE_RENEW_S,
    Deployer,
    Entry,
    Slot,
    View,
    Waiter,
    describe,
)
from openai_api.access import mark_waited
from openai_api.concurrency import gives_way, giving_way, key_waits_too_much

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


class Controller(RoomMaking):
    def __init__(
        self,
        deployer: Deployer,
        clock: Clock | None = None,
        *,
        queue_timeout_s: float = 900.0,
        max_queued: int = 1000,
        max_waiting_per_key: int = 0,
        aging_s: float = 120.0,
        collation_s: float = 60.0,
        max_loaded: int = 0,
        evict_unused: bool = True,
    ) -> None:
        self.deployer = deployer
        self.clock = clock or SystemClock()
        self.queue_timeout_s = queue_timeout_s
        self.max_queued = max_queued
        self.max_waiting_per_key = max_waiting_per_key  # 0: no cap
        self.aging_s = aging_s  # a waiting request rises one class per this many seconds
        self.collation_s = collation_s
        self.max_loaded = max_loaded
        self.evict_unused = evict_unused
        self.entries: dict[int, Entry] = {}
        self.lock = asyncio.Lock()
        self.changed = asyncio.Event()
        self.last_stop_at = float("-inf")  # the last on-demand stop, for the settle grace
        # Deployments waiting for memory, in order of first arrival (the keys); the head is
        # the one whose best request ranks highest (`head`), the first of equals.
        self.queue: dict[int, None] = {}
        # Memory make-room freed for a deployment: reserved for it while it heads the queue,
        # until it starts or its requests give up.
        self.freed_for: dict[int, float] = {}
        # Models in use drained for the queue's head (victim -> head): no new slot is granted
        # on them, so that they go unused and make-room can swap them out (collation's bound).
        self.draining: dict[int, int] = {}
        self.order: tuple[int, list[int]] = (-1, [])  # wait_figures.queue_order's cache
        self._background: set[asyncio.Future[Any]] = set()
        # Called with a deployment's id when its in-flight or queued count changes.
        self.on_counts: Callable[[int], None] | None = None

    # --- notifications ---------------------------------------------------------------------

    def notify(self) -> None:
        """Something changed (a state, a stop, a removal, the queue): every waiter looks."""
        self.changed.set()
        self.changed = asyncio.Event()

    def _counted(self, deployment_id: int) -> None:
        if self.on_counts is not None:
            self.on_counts(deployment_id)

    def entry(self, deployment_id: int) -> Entry:
        if deployment_id not in self.entries:
            self.entries[deployment_id] = Entry(idle_since=self.clock.now())
        return self.entries[deployment_id]

    def waiting_total(self) -> int:
        return sum(e.waiting for e in self.entries.values())

    def _make_way(self, key_id: int | None) -> bool:
        """A full queue makes way for `key_id`'s request: openai_api/concurrency.giving_way."""
        waiting = [w for e in self.entries.values() for w in e.waiters.values() if not w.gives_way]
        if (victim := giving_way(waiting, key_id)) is None:
            return False
        victim.gives_way = True
        self.notify()  # it wakes, and leaves
        return True

    def waiting_of(self, key_id: int) -> int:
        return sum(w.key_id == key_id for e in self.entries.values() for w in e.waiters.values())

    # --- slots -----------------------------------------------------------------------------

    async def acquire(
        self,
        deployment_id: int,
        on_queued: Callable[[], Any] | None = None,
        hint: View | None = None,
        priority: int = 0,
        key_id: int | None = None,
        waited_s: float = 0.0,
    ) -> Slot:
        """A slot on a ready deployment: at once, or after starting it, making room for it
        or queueing for memory. `hint` is the caller's in-memory view (the gateway's route
        table): while our lease holds, a ready hint is granted with no database access.
        `priority`: the caller's key's class; the deployment's own is added to it.
        `waited_s`: what the request already waited before it asked (a max_concurrency
        place): its deadline is queue_timeout_s from its arrival, not from here."""
        entry = self.entry(deployment_id)
        if hint is not None and hint.state == State.READY and deployment_id not in self.draining:
            slot = await self._grant(hint, entry)
            if slot is not None:
                return slot
        changed = self.changed
        view = await self.deployer.view(deployment_id)
        if view is None:
            raise errors.not_found(str(deployment_id))
        if view.state == State.READY:
            slot = await self._grant(view, entry)
            if slot is not None:
                return slot
            changed, view = self.changed, None  # a stop was approved first: read it again
        if key_id is not None and 0 < self.max_waiting_per_key <= self.waiting_of(key_id):
            raise key_waits_too_much(self.max_waiting_per_key)  # before it takes a place
        if self.waiting_total() >= self.max_queued and not self._make_way(key_id):
            raise errors.queue_full()
        if view is not None:
            entry.priority, entry.start_s = view.priority, view.start_s
        now = self.clock.now()
        waiter = Waiter(
            now + self.queue_timeout_s - max(waited_s, 0.0),
            on_queued,
            priority=priority + entry.priority,
            arrived=now,
            key_id=key_id,
        )
        entry.waiting += 1
        entry.waiters[id(waiter)] = waiter
        try:
            # The first look uses the row just read: each read is a trip through a worker
            # thread, and in a burst every trip waits behind the whole burst's parsing.
            seen = None if view is None else (view, changed)
            while True:
                if waiter.gives_way:
                    raise gives_way("the on-demand models")
                slot = await self._look(deployment_id, entry, waiter, seen)
                if slot is not None:
                    waited = self.clock.now() - waiter.arrived
                    metrics.queue_wait.labels(class_label(waiter.priority)).observe(waited)
                    return slot
                seen = None
        finally:
            entry.waiting -= 1
            del entry.waiters[id(waiter)]
            if entry.waiting == 0:
                self._undrain(deployment_id)  # nobody waits for what was drained for it
                entry.starting_for_request = False
                self.freed_for.pop(deployment_id, None)
                if deployment_id in self.queue:
                    del self.queue[deployment_id]
                    self.notify()  # the next entry may be the head now

    async def _look(
        self,
        deployment_id: int,
        entry: Entry,
        waiter: Waiter,
        seen: tuple[View, asyncio.Event] | None = None,
    ) -> Slot | None:
        """One look of a waiting request: a slot, or None to look again (after waiting on a
        start, a change or the poll interval); raises what the request gets instead. `seen`
        is a row the caller has just read, with the change event taken before reading it."""
        view: View | None
        if seen is not None:
            view, changed = seen
        else:
            changed = self.changed  # taken before looking, so a change made meanwhile wakes us
            view = await self.deployer.view(deployment_id)
        if view is None:
            if entry.starting_for_request:
                raise errors.stopped(str(deployment_id))
            raise errors.not_found(str(deployment_id))
        drained = deployment_id in self.draining
        if view.state == State.READY and not drained:
            return await self._grant(view, entry)  # None: a stop was approved first
        now = self.clock.now()
        if now >= waiter.deadline:
            metrics.queue_timeouts.labels(view.name).inc()
            self._record_timeout(entry, deployment_id)
            raise errors.queue_timeout(view.name)
        if view.state == State.READY:
            # Drained for the queue's head (collation's bound): it waits for the model to be
            # swapped out and started again for it.
            await self.clock.wait(changed, min(POLL_S, waiter.deadline - now))
            return None
        if waiter.attempt is None:
            waiter.attempt = self._attempt_to_follow(view, entry, now)
            if waiter.attempt is None:
                # Starting by hand, stopping, switched: wait without starting it.
                await self.clock.wait(changed, min(POLL_S, waiter.deadline - now))
                return None
            mark_waited("start")
        outcome = await attempts.outcome(self.clock, waiter.attempt, changed, waiter.deadline - now)
        if outcome is None:
            return None  # still running: look again
        waiter.attempt = None
        if outcome == StartOutcome.FAILED:
            raise errors.start_failed(view.name, entry.failure)
        if outcome == StartOutcome.STOPPED:
            entry.starting_for_request = False
            raise errors.stopped(view.name)
        if outcome == StartOutcome.QUEUED:
            await self._queued(view, entry, waiter, changed)
        elif outcome == StartOutcome.ELSEWHERE:
            await self.clock.wait(changed, min(POLL_S, waiter.deadline - now))
        return None

    def _attempt_to_follow(
        self, view: View, entry: Entry, now: float
    ) -> asyncio.Task[StartOutcome] | None:
        """The start a waiter follows: the running one, or one begun for it."""
        if view.failures_forgiven != entry.failures_forgiven:
            # Forgiven since (a mode switch, a new configuration), maybe in another process.
            entry.failures_forgiven = view.failures_forgiven
            self.reset_backoff(view.id)
        if now < entry.backoff_until:
            raise errors.start_failed(view.name, entry.failure)
        if not view.on_demand and entry.attempt is None:
            # Switched to always on: its start is the switch's, never a request's. Failed,
            # it is answered so; otherwise the request waits for it.
            if view.state == State.FAILED:
                raise errors.start_failed(view.name, "its switch to always on did not start it")
            return None
        startable = view.state in STARTABLE_STATES or view.state == State.ASLEEP
        # While set_mode starts it (pending always_on), the request waits for that.
        if entry.attempt is None and startable and view.pending_mode is None:
            entry.starting_for_request = True
            entry.attempt = self._start_attempt(entry, view)
        return entry.attempt

    async def _queued(
        self, view: View, entry: Entry, waiter: Waiter, changed: asyncio.Event
    ) -> None:
        """Wait in the memory queue until something changes (a stop, a state, the queue),
        another deployment's idle timeout runs out (it may be a victim now) or the poll
        interval passes; the first time, the request is told (the queued notice)."""
        self.queue.setdefault(view.id, None)  # first: the notice says its place
        if not waiter.told_queued and waiter.on_queued is not None:
            waiter.told_queued = True
            waiter.on_queued()
        mark_waited("queue")
        entry.queue_in(waiter)
        gauge = metrics.queued.labels(view.name)
        gauge.inc()
        self._counted(view.id)
        now = self.clock.now()
        timers = [(e.idle_since, e.idle_timeout_s) for e in self.entries.values() if not e.inflight]
        expiry = policy.next_idle_expiry(timers, now)
        timeout = min(POLL_S, waiter.deadline - now, POLL_S if expiry is None else expiry - now)
        try:
            await self.clock.wait(changed, timeout)
        finally:
            entry.queue_out(waiter)
            gauge.dec()
            self._counted(view.id)

    def _record_timeout(self, entry: Entry, deployment_id: int) -> None:
        """One audit row per deployment and minute, however many requests time out."""
        now = self.clock.now()
        if now - entry.timeout_recorded_at < 60:
            return
        entry.timeout_recorded_at = now
        self._in_background(self.deployer.queue_timed_out(deployment_id, self.queue_timeout_s))

    def _in_background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _grant(self, view: View, entry: Entry) -> Slot | None:
        """A slot, once the lease covers the idle timeout that starts now; None when the
        lease was refused (a stop of this deployment was approved first) or it is drained."""
        if view.id in self.draining:
            return None
        entry.idle_timeout_s = view.idle_timeout_s
        if not await self._hold(view.id, entry):
            return None
        entry.inflight += 1
        self._counted(view.id)
        entry.last_request_at = time.time()
        entry.idle_since = self.clock.now()
        entry.used(entry.idle_since)
        entry.backoff_s, entry.backoff_until = 0.0, 0.0
        return Slot(view.id, view.urls)

    async def _hold(self, deployment_id: int, entry: Entry) -> bool:
        """Keep our lease on the row a full idle timeout (and LEASE_EXTRA_S) ahead of now:
        what the reaper in another process reads as "idle since". Written at most every
        LEASE_RENEW_S, never per request."""
        if self._lease_covers(entry):
            return True  # no database write
        seconds = entry.idle_timeout_s + LEASE_EXTRA_S
        now = self.clock.now()
        if not await self.deployer.hold(deployment_id, seconds):
            entry.lease_until = float("-inf")
            return False
        entry.lease_until = now + seconds
        entry.lease_wall_until = time.time() + seconds
        return True

    def _lease_covers(self, entry: Entry) -> bool:
        """Our lease already runs a full idle timeout past now (less the renewal margin)."""
        needed = self.clock.now() + entry.idle_timeout_s + LEASE_EXTRA_S - LEASE_RENEW_S
        return entry.lease_until >= needed

    async def renew_leases(self) -> None:
        """For slots that outlast their lease (long streams): run every LEASE_RENEW_S / 2."""
        for deployment_id, entry in list(self.entries.items()):
            if entry.inflight and entry.lease_until < self.clock.now() + LEASE_EXTRA_S:
                view = await self.deployer.view(deployment_id)
                if view is not None and view.state == State.READY:
                    entry.idle_timeout_s = view.idle_timeout_s
                    await self._hold(deployment_id, entry)

    def adopt(self, deployment_id: int, urls: tuple[str, ...]) -> Slot:
        """A slot a gateway held before this process owned the scheduling (it says so as it
        connects): counted in flight at once, its lease renewed with the others'."""
        entry = self.entry(deployment_id)
        entry.inflight += 1
        entry.idle_since = self.clock.now()
        self._counted(deployment_id)
        return Slot(deployment_id, urls)

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        entry = self.entry(slot.deployment_id)
        entry.inflight -= 1
        entry.idle_since = self.clock.now()
        self._counted(slot.deployment_id)
        if entry.inflight == 0 and not self._lease_covers(entry):
            # The burst's last byte: the idle timer restarts here for the reaper too, so the
            # lease must cover a full idle timeout from now (no task, no write, when a
            # renewal in the last LEASE_RENEW_S already covers it).
            self._in_background(self._hold(slot.deployment_id, entry))

    # --- starts ----------------------------------------------------------------------------

    def _start_attempt(self, entry: Entry, view: View) -> asyncio.Task[StartOutcome]:
        attempt = asyncio.create_task(self._attempt(view))
        entry.attempt_began, entry.waking = self.clock.now(), view.state == State.ASLEEP

        def ended(task: asyncio.Task[StartOutcome]) -> None:
            # Its outcome is for the requests that waited on it (they hold the task), never
            # for a later one: a failure forgiven since, a stop long over.
            if entry.attempt is task:
                entry.attempt = None
            # Others look again once it is done (a failed start frees memory, a started one
            # takes it); "no memory now" changed nothing, and waking them for it would have
            # two queued models retry in turn without end.
            quiet = (StartOutcome.QUEUED, StartOutcome.NOBODY)
            if task.cancelled() or task.exception() or task.result() not in quiet:
                self.notify()

        attempt.add_done_callback(ended)
        return attempt

    async def _attempt(self, view: View) -> StartOutcome:
        """One start, shared by all its waiters (a model that can never fit refused first, then
        its image and engine environment made outside the lock, each phase a span): ready,
        failed, stopped or queued; raises does_not_fit."""
        with tracing.span("modelship.ondemand.start", **{"modelship.deployment": view.name}):
            try:
                return await self._attempt_start(view)
            except EngineUnreachable as exc:
                # The container engine (Docker's daemon, Ray) did not answer: nothing started
                # and the deployment is as it was. Its requests hear why, as a 503; no
                # backoff, since the next request's start may find the daemon back.
                raise errors.start_failed(view.name, str(exc)) from exc

    async def _attempt_start(self, view: View) -> StartOutcome:
        if view.state in STARTABLE_STATES:
            # The fit first: a model that can never fit is refused at once, before its image
            # is pulled and its engine environment installed (minutes, for nothing).
            self._refuse_what_never_fits(view, await self.deployer.budget(), False)
            with tracing.span("modelship.ondemand.prepare"):
                prepared = await self.deployer.prepare(view.id)
            if not prepared:
                return self._start_ended(view, await self.deployer.view(view.id))
        entry, stopped_a_victim, retried = self.entry(view.id), False, False
        for _ in range(4):
            running: asyncio.Future[None] | None = None
            async with self.lock:
                current = await self.deployer.view(view.id)
                if current is None:
                    return StartOutcome.STOPPED
                if current.state == State.READY:
                    return StartOutcome.READY
                if entry.waiting == 0:
                    return StartOutcome.NOBODY  # everyone left: start nothing
                if not await self._may_start(current):
                    return StartOutcome.QUEUED
                began = time.monotonic()
                try:
                    if current.state in (*STARTABLE_STATES, State.ASLEEP):
                        await self._check_cap(current)
                    if current.state == State.ASLEEP:
                        with tracing.span("modelship.ondemand.wake"):
                            await self.deployer.wake(view.id)
                    elif current.state in STARTABLE_STATES:
                        with tracing.span("modelship.ondemand.launch"):
                            running = await attempts.claimed(self.deployer, view.id)
                    elif current.state == State.STOPPING:
                        return StartOutcome.STOPPED
                    else:
                        return StartOutcome.ELSEWHERE
                except InsufficientMemory:
                    with tracing.span("modelship.ondemand.make_room"):
                        made = await self._make_room(current, stopped_a_victim)
                    if not made:
                        return StartOutcome.QUEUED
                    stopped_a_victim = True
                    continue
            if running is not None:
                # Its memory is claimed: the engine's health wait runs outside the lock, so
                # that the site's other starts and wakes go on meanwhile.
                with tracing.span("modelship.ondemand.health"):
                    await running
            after = await self.deployer.view(view.id)
            if after is not None and after.out_of_memory and not retried:
                # Out of memory: it claims what it showed it needs now; room is made for
                # that (a victim more, maybe) and it starts once more.
                retried = True
                metrics.out_of_memory_retries.labels(view.name).inc()
                continue
            outcome = self._start_ended(view, after)
            if outcome != StartOutcome.ELSEWHERE:  # the starting process counts it
                metrics.cold_starts.labels(view.name, outcome.value).inc()
                metrics.starts.labels(view.name, "retry" if retried else "request").inc()
            if outcome == StartOutcome.READY and after is not None:
                load_charge.loaded(after, entry.waiters.values(), time.monotonic() - began)
            return outcome
        return StartOutcome.QUEUED

    def _start_ended(self, view: View, after: View | None) -> StartOutcome:
        entry = self.entry(view.id)
        if after is None or after.state in (State.STOPPED, State.STOPPING):
            return StartOutcome.STOPPED  # stopped or removed while starting: no backoff
        if after.state == State.READY:
            self.freed_for.pop(view.id, None)  # started: what was freed for it is used
            self._undrain(view.id)
            entry.backoff_s, entry.backoff_until = 0.0, 0.0
            entry.idle_since = self.clock.now()
            return StartOutcome.READY
        if after.state == State.STARTING:
            return StartOutcome.ELSEWHERE  # the gate was another's, and so is this start
        if after.state == State.FAILED:
            entry.backoff_s = policy.next_backoff(entry.backoff_s)
            entry.backoff_until = self.clock.now() + entry.backoff_s
            entry.failure = (
                "it ran out of memory as it started, also when it claimed what its first try"
                " showed it needs (its page says more)"
                if after.out_of_memory
                else "the engine failed to start"
            )
            return StartOutcome.FAILED
        return StartOutcome.QUEUED

    def reset_backoff(self, deployment_id: int) -> None:
        """A mode switch or a changed configuration: start failures are forgiven."""
        entry = self.entry(deployment_id)
        entry.backoff_s, entry.backoff_until = 0.0, 0.0

    # --- status ----------------------------------------------------------------------------

    def status(self, view: View | None, deployment_id: int) -> dict[str, Any]:
        return describe(self.entry(deployment_id), None if view is None else view.state)
