"""The on-demand controller: slots, starts shared by every waiter, make-room, the idle
reaper and start-failure backoff, as the on-demand seed's Controller section says.

It runs in the gateway's event loop and drives a deployer through an async interface, so
that the same state machine serves the real deployer (in threads) and a test's fake one. Its
counters, timers and queue live in memory: nothing is persisted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.engine_metrics import Load
from deployments.memory import InsufficientMemory
from ondemand import errors
from ondemand.clock import Clock
from openai_api.errors import GatewayError

STARTABLE = ("planned", "stopped", "failed")
SLEEPING = ("planned", "stopped", "asleep", "stopping")  # no engine serves
BACKOFF_FIRST_S = 60.0
BACKOFF_MAX_S = 900.0
SETTLE_S = 20.0  # how long freed memory may take to show, and the does_not_fit grace
POLL_S = 15.0  # a waiter looks again at least this often
SAMPLE_MAX_AGE_S = 60.0


@dataclass(frozen=True)
class View:
    """What the controller reads of a deployment."""

    id: int
    name: str
    state: str
    on_demand: bool
    need_gib: float
    idle_timeout_s: float
    pending_mode: str | None = None
    urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class Budget:
    capacity_gib: float  # what on-demand deployments can ever use
    free_gib: float


class Deployer(Protocol):
    async def view(self, deployment_id: int) -> View | None: ...

    async def views(self) -> list[View]: ...

    async def restart(self, deployment_id: int) -> None:
        """Start it and return once the start has ended; InsufficientMemory when it does
        not fit."""
        ...

    async def wake(self, deployment_id: int) -> None: ...

    async def stop(
        self, deployment_id: int, precheck: Callable[[View], bool], reason: str
    ) -> bool: ...

    async def budget(self) -> Budget: ...

    async def load(self, deployment_id: int) -> tuple[float, Load] | None:
        """The engine's last load sample and when it was taken (clock time)."""
        ...

    async def hold(self, deployment_id: int, seconds: float) -> bool:
        """Hold the deployment's lease for `seconds` while it is ready; False when a stop
        was approved first (see ondemand/lease.py)."""
        ...

    async def queue_timed_out(self, deployment_id: int, waited_s: float) -> None:
        """Record that requests gave up waiting (the audit's ondemand_queue_timeout)."""
        ...


@dataclass
class Entry:
    """The controller's memory of one deployment."""

    inflight: int = 0
    waiting: int = 0
    queued: int = 0
    last_request_at: float | None = None  # wall time, for status
    idle_since: float = 0.0  # clock time the idle timer last restarted
    attempt: asyncio.Task[str] | None = None
    starting_for_request: bool = False
    backoff_s: float = 0.0
    backoff_until: float = 0.0
    failure: str = ""
    lease_until: float = float("-inf")  # clock time our lease on the row runs out
    timeout_recorded_at: float = float("-inf")


@dataclass
class Slot:
    deployment_id: int
    urls: tuple[str, ...] = ()
    released: bool = field(default=False)


LEASE_EXTRA_S = 30.0  # a lease runs this long past the idle timeout
LEASE_RENEW_S = 15.0  # and is renewed when less than this is left of that extra


class Controller:
    def __init__(
        self,
        deployer: Deployer,
        clock: Clock | None = None,
        *,
        queue_timeout_s: float = 900.0,
        max_queued: int = 1000,
    ) -> None:
        self.deployer = deployer
        self.clock = clock or Clock()
        self.queue_timeout_s = queue_timeout_s
        self.max_queued = max_queued
        self.entries: dict[int, Entry] = {}
        self.lock = asyncio.Lock()
        self.changed = asyncio.Event()
        self.last_stop_at = float("-inf")  # the last on-demand stop, for the settle grace
        # Deployments waiting for memory, in order of first arrival, with what each needs:
        # the head's memory is reserved for it.
        self.queue: dict[int, float] = {}
        self._background: set[asyncio.Future[None]] = set()
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

    # --- slots -----------------------------------------------------------------------------

    async def acquire(
        self,
        deployment_id: int,
        on_queued: Callable[[], Any] | None = None,
        hint: View | None = None,
    ) -> Slot:
        """A slot on a ready deployment: at once, or after starting it, making room for it
        or queueing for memory. `hint` is the caller's in-memory view (the gateway's route
        table): while our lease holds, a ready hint is granted with no database access."""
        entry = self.entry(deployment_id)
        if hint is not None and hint.state == "ready":
            slot = await self._grant(hint, entry)
            if slot is not None:
                return slot
        view = await self.deployer.view(deployment_id)
        if view is None:
            raise errors.not_found(str(deployment_id))
        if view.state == "ready":
            slot = await self._grant(view, entry)
            if slot is not None:
                return slot
        if self.waiting_total() >= self.max_queued:
            raise errors.queue_full()
        deadline = self.clock.now() + self.queue_timeout_s
        notified_queue = False
        # The start this request waits on, until it has read that start's outcome.
        attempt: asyncio.Task[str] | None = None
        entry.waiting += 1
        try:
            while True:
                # Taken before looking, so a change made while we look still wakes us.
                changed = self.changed
                view = await self.deployer.view(deployment_id)
                if view is None:
                    if entry.starting_for_request:
                        raise errors.stopped(str(deployment_id))
                    raise errors.not_found(str(deployment_id))
                if view.state == "ready":
                    slot = await self._grant(view, entry)
                    if slot is not None:
                        return slot
                    continue  # a stop was approved first: look again
                now = self.clock.now()
                if now >= deadline:
                    self._record_timeout(entry, deployment_id)
                    raise errors.queue_timeout(view.name)
                if attempt is None:
                    if now < entry.backoff_until:
                        raise errors.start_failed(view.name, entry.failure)
                    startable = view.state in STARTABLE or view.state == "asleep"
                    # While set_mode starts it (pending always_on), the request waits for that.
                    if entry.attempt is None and startable and view.pending_mode is None:
                        entry.starting_for_request = True
                        entry.attempt = self._start_attempt(entry, view)
                    if entry.attempt is None:
                        # Starting by hand, stopping, switched: wait without starting it.
                        await self.clock.wait(changed, min(POLL_S, deadline - now))
                        continue
                    attempt = entry.attempt
                outcome = await self._await_attempt(attempt, changed, deadline - now)
                if outcome is None:
                    continue  # still running: look again
                attempt = None
                if outcome == "failed":
                    raise errors.start_failed(view.name, entry.failure)
                if outcome == "stopped":
                    entry.starting_for_request = False
                    raise errors.stopped(view.name)
                if outcome == "queued":
                    if not notified_queue and on_queued is not None:
                        notified_queue = True
                        on_queued()
                    self.queue.setdefault(deployment_id, view.need_gib)
                    entry.queued += 1
                    self._counted(deployment_id)
                    try:
                        # Until something changes (a stop, a state, the queue) or a while.
                        timeout = min(POLL_S, deadline - self.clock.now())
                        await self.clock.wait(changed, timeout)
                    finally:
                        entry.queued -= 1
                        self._counted(deployment_id)
        finally:
            entry.waiting -= 1
            if entry.waiting == 0:
                entry.starting_for_request = False
                if self.queue.pop(deployment_id, None) is not None:
                    self.notify()  # the next entry may be the head now

    def _record_timeout(self, entry: Entry, deployment_id: int) -> None:
        """One audit row per deployment and minute, however many requests time out."""
        now = self.clock.now()
        if now - entry.timeout_recorded_at < 60:
            return
        entry.timeout_recorded_at = now
        waited = self.queue_timeout_s
        task = asyncio.ensure_future(self.deployer.queue_timed_out(deployment_id, waited))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _await_attempt(
        self, attempt: asyncio.Task[str], changed: asyncio.Event, timeout: float
    ) -> str | None:
        """The attempt's outcome once it ends; None when a change or the poll interval came
        first. The attempt is shielded: a waiter that gives up never cancels it half-way."""
        if not attempt.done():
            finished: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(attempt))
            woke: asyncio.Future[Any] = asyncio.ensure_future(
                self.clock.wait(changed, min(POLL_S, timeout))
            )
            try:
                await asyncio.wait({finished, woke}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woke.cancel()
                if not finished.done():
                    finished.cancel()
            if not attempt.done():
                return None
        exc = attempt.exception()
        if exc is not None:
            raise exc
        return attempt.result()

    async def _grant(self, view: View, entry: Entry) -> Slot | None:
        """A slot, once the lease covers the idle timeout that starts now; None when the
        lease was refused (a stop of this deployment was approved first)."""
        if not await self._hold(view, entry):
            return None
        entry.inflight += 1
        self._counted(view.id)
        entry.last_request_at = time.time()
        entry.idle_since = self.clock.now()
        entry.backoff_s, entry.backoff_until = 0.0, 0.0
        return Slot(view.id, view.urls)

    async def _hold(self, view: View, entry: Entry) -> bool:
        needed = self.clock.now() + view.idle_timeout_s + LEASE_EXTRA_S - LEASE_RENEW_S
        if entry.lease_until >= needed:
            return True  # no database write: the lease already covers it
        seconds = view.idle_timeout_s + LEASE_EXTRA_S
        now = self.clock.now()
        if not await self.deployer.hold(view.id, seconds):
            entry.lease_until = float("-inf")
            return False
        entry.lease_until = now + seconds
        return True

    async def renew_leases(self) -> None:
        """For slots that outlast their lease (long streams): run every LEASE_RENEW_S / 2."""
        for deployment_id, entry in list(self.entries.items()):
            if entry.inflight and entry.lease_until < self.clock.now() + LEASE_EXTRA_S:
                view = await self.deployer.view(deployment_id)
                if view is not None and view.state == "ready":
                    await self._hold(view, entry)

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        entry = self.entry(slot.deployment_id)
        entry.inflight -= 1
        entry.idle_since = self.clock.now()
        self._counted(slot.deployment_id)

    # --- starts ----------------------------------------------------------------------------

    def _start_attempt(self, entry: Entry, view: View) -> asyncio.Task[str]:
        attempt = asyncio.create_task(self._attempt(view))

        def ended(task: asyncio.Task[str]) -> None:
            # Its outcome is for the requests that waited on it (they hold the task), never
            # for a later one: a failure forgiven since, a stop long over.
            if entry.attempt is task:
                entry.attempt = None
            # Others look again once it is done (a failed start frees memory, a started one
            # takes it); "no memory now" changed nothing, and waking them for it would have
            # two queued models retry in turn without end.
            if task.cancelled() or task.exception() or task.result() not in ("queued", "nobody"):
                self.notify()

        attempt.add_done_callback(ended)
        return attempt

    async def _attempt(self, view: View) -> str:
        """One start of a deployment, shared by all its waiters: ready, failed, stopped or
        queued (no memory now); raises does_not_fit."""
        entry = self.entry(view.id)
        stopped_a_victim = False
        async with self.lock:
            for _ in range(3):
                current = await self.deployer.view(view.id)
                if current is None:
                    return "stopped"
                if current.state == "ready":
                    return "ready"
                if entry.waiting == 0:
                    return "nobody"  # everyone left: start nothing
                if not await self._may_start(current):
                    return "queued"
                try:
                    if current.state == "asleep":
                        await self.deployer.wake(view.id)
                    elif current.state in STARTABLE:
                        await self.deployer.restart(view.id)
                    else:
                        return "stopped" if current.state == "stopping" else "queued"
                except InsufficientMemory as exc:
                    made_room = await self._make_room(current, exc, stopped_a_victim)
                    if not made_room:
                        return "queued"
                    stopped_a_victim = True
                    continue
                return self._start_ended(view, await self.deployer.view(view.id))
            return "queued"

    async def _may_start(self, view: View) -> bool:
        """A deployment behind the head of the queue starts only within the memory free
        beyond what the head needs (and makes no room): the head's memory is its own."""
        head = next(iter(self.queue), None)
        if head is None or head == view.id or self.entry(head).waiting == 0:
            return True
        budget = await self.deployer.budget()
        return budget.free_gib - self.queue[head] + 1e-9 >= view.need_gib

    def _start_ended(self, view: View, after: View | None) -> str:
        entry = self.entry(view.id)
        if after is None or after.state in ("stopped", "stopping"):
            return "stopped"  # stopped or removed while starting: no backoff
        if after.state == "ready":
            entry.backoff_s, entry.backoff_until = 0.0, 0.0
            entry.idle_since = self.clock.now()
            return "ready"
        if after.state == "failed":
            entry.backoff_s = (
                BACKOFF_FIRST_S if not entry.backoff_s else min(entry.backoff_s * 2, BACKOFF_MAX_S)
            )
            entry.backoff_until = self.clock.now() + entry.backoff_s
            entry.failure = "the engine failed to start"
            return "failed"
        return "queued"

    def reset_backoff(self, deployment_id: int) -> None:
        """A mode switch or a changed configuration: start failures are forgiven."""
        entry = self.entry(deployment_id)
        entry.backoff_s, entry.backoff_until = 0.0, 0.0

    # --- make room -------------------------------------------------------------------------

    async def _make_room(self, view: View, exc: InsufficientMemory, after_victim: bool) -> bool:
        """Stop idle on-demand deployments, least recently used first, until the shortfall
        is covered; False (queue) when they cannot cover it. does_not_fit when the model
        needs more than on-demand deployments can ever use."""
        budget = await self.deployer.budget()
        settling = self.clock.now() - self.last_stop_at < SETTLE_S
        if view.need_gib > budget.capacity_gib + 1e-9 and not settling and not after_victim:
            raise errors.does_not_fit(view.name, view.need_gib, budget.capacity_gib)
        victims = await self._victims(view.id, exc.shortfall_gib)
        if victims is None:
            return False
        stopped = 0
        for victim in victims:
            if await self.deployer.stop(
                victim.id, self._still_idle, f"Put to sleep to make room for {view.name}"
            ):
                stopped += 1
                self.last_stop_at = self.clock.now()
        self.notify()
        if not stopped:
            return False
        # Freed memory may take a moment to show (a driver releasing it).
        deadline = self.clock.now() + SETTLE_S
        while (await self.deployer.budget()).free_gib + 1e-9 < view.need_gib:
            if self.clock.now() >= deadline:
                break
            await self.clock.wait(asyncio.Event(), 1.0)
        return True

    async def _victims(self, for_id: int, shortfall: float) -> list[View] | None:
        candidates = []
        for other in await self.deployer.views():
            if other.id != for_id and await self._idle(other):
                candidates.append(other)
        candidates.sort(key=lambda v: self.entry(v.id).idle_since)  # least recently used
        chosen, covered = [], 0.0
        for candidate in candidates:
            if covered + 1e-9 >= shortfall:
                break
            if candidate.state == "asleep":
                continue  # an asleep engine already holds nothing against the budget
            chosen.append(candidate)
            covered += candidate.need_gib
        return chosen if covered + 1e-9 >= shortfall else None

    async def _idle(self, view: View) -> bool:
        """Idle by the seed's rules: on demand, ready or asleep, no slot in flight, idle for
        its whole timeout, and a fresh load sample showing nothing running or waiting."""
        if not self._still_idle(view):
            return False
        if view.state == "asleep":
            return True
        sample = await self.deployer.load(view.id)
        if sample is None:
            return False
        taken_at, load = sample
        return self.clock.now() - taken_at < SAMPLE_MAX_AGE_S and load.idle

    def _still_idle(self, view: View) -> bool:
        """The part of the idle rules the deployer's precheck re-checks on the fresh row,
        with no await between it and the stop."""
        entry = self.entry(view.id)
        return (
            view.on_demand
            and view.pending_mode is None
            and view.state in ("ready", "asleep")
            and entry.inflight == 0
            and entry.waiting == 0
            and self.clock.now() - entry.idle_since >= view.idle_timeout_s
        )

    # --- reaper and status -----------------------------------------------------------------

    async def reap_once(self) -> list[str]:
        """Stop every on-demand deployment that is idle; returns the names stopped."""
        stopped = []
        for view in await self.deployer.views():
            if view.state != "ready" or not await self._idle(view):
                continue
            minutes = round(view.idle_timeout_s / 60)
            if await self.deployer.stop(
                view.id, self._still_idle, f"Put to sleep after {minutes} min idle"
            ):
                stopped.append(view.name)
                self.last_stop_at = self.clock.now()
        if stopped:
            self.notify()
        return stopped

    def status(self, view: View | None, deployment_id: int) -> dict[str, Any]:
        return describe(self.entry(deployment_id), None if view is None else view.state)


def describe(entry: Entry, state: str | None) -> dict[str, Any]:
    """The seed's status: counts and the phase, in its order of precedence (a removed
    deployment, state None, reads as failed)."""
    if entry.queued:
        phase = "queued"
    elif entry.attempt is not None and not entry.attempt.done():
        phase = "starting_for_request"
    elif entry.inflight:
        phase = "serving"
    elif state is None or state == "failed":
        phase = "failed"
    elif state in SLEEPING:
        phase = "sleeping"
    else:
        phase = "idle"
    return {
        "inflight": entry.inflight,
        "queued": entry.queued,
        "last_request_at": entry.last_request_at,
        "phase": phase,
    }


__all__ = ["Budget", "Controller", "Deployer", "GatewayError", "Slot", "View"]
