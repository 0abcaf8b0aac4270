"""What the on-demand controller reads of deployments (View, Budget, through a Deployer)
and what it remembers of them (Entry, Waiter, Slot), with the phase that memory reads as."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from common.priority import rank
from deployments.models import State
from ondemand.policy import Phase, StartOutcome, decayed_uses, room_after

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Sequence

    from deployments.engine_metrics import Load
    from deployments.placement import Demand, Device

SLEEPING = (State.PLANNED, State.STOPPED, State.ASLEEP, State.STOPPING)  # no engine serves


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
    # The engine has load gauges: make-room also asks them whether it is idle. Without,
    # the gateway's slots and release times alone decide (every engine kind is reapable).
    gauged: bool = True
    # The row's lease (wall time, seconds): held by this gateway or another process's.
    lease_until: float | None = None
    # On a GPU host: what a start of it asks of the devices (None: no GPU), and what its
    # engines hold on each device now.
    demand: Demand | None = None
    held: tuple[tuple[int, float], ...] = ()
    # Raised on the row whenever its start failures are forgiven (from any process).
    failures_forgiven: int = 0
    # False: never stopped to make room for another start (pinned once loaded).
    evictable: bool = True
    # Ready for less than MSHIP_MIN_RESIDENCY_S, as the row was read: make-room takes it
    # last (no thrash between two models that take turns).
    recently_loaded: bool = False
    priority: int = 0  # its class: a request of a lower one never stops it to make room
    start_s: float | None = None  # its starts' measured running mean (None: never measured)
    wakes_on: tuple[int, ...] = ()  # asleep: the GPUs its engine holds its context on
    out_of_memory: bool = False  # failed: its last start ran out of memory
    gpu_share: float = 0.0  # what its replicas hold of a GPU (openai_api/usage/gpu_share.py)
    # What it holds now, where that is not need_gib: asleep, what its engines kept.
    holds_gib: float | None = None

    @property
    def frees_gib(self) -> float:
        """What stopping it gives back."""
        return self.need_gib if self.holds_gib is None else self.holds_gib


@dataclass(frozen=True)
class Budget:
    capacity_gib: float  # what on-demand deployments can ever use
    free_gib: float
    # Each GPU with what is free on it now; empty on a host without GPUs (one pool).
    devices: tuple[Device, ...] = ()
    # How many deployments have an engine on each GPU, and MSHIP_MAX_LOADED_PER_GPU (0: none).
    engines_on: tuple[tuple[int, int], ...] = ()
    gpu_cap: int = 0

    def room_after(self, view: View, stopped: Sequence[View] = ()) -> bool:
        """Whether the view's start fits once `stopped` release their memory (and, under a
        cap per GPU, their place on their GPUs)."""
        where = view.wakes_on
        if self.gpu_cap > 0 and self.devices:
            counts = dict(self.engines_on)
            for gone in stopped:
                if gone.state == State.ASLEEP:
                    continue  # not counted as an engine on its GPUs (what it keeps is)
                for index in {device for device, _ in gone.held}:
                    counts[index] = counts.get(index, 0) - 1
            open_ = {d.index for d in self.devices if counts.get(d.index, 0) < self.gpu_cap}
            where = tuple(i for i in (where or open_) if i in open_)
            if not where:
                return False
        # A sleeper waking takes back what it kept: that much of its need is held already.
        released = [*stopped, view] if view.state == State.ASLEEP else stopped
        return room_after(view.demand, view.need_gib, self.free_gib, self.devices, released, where)


class Deployer(Protocol):
    async def view(self, deployment_id: int) -> View | None: ...

    async def views(self) -> list[View]: ...

    async def restart(self, deployment_id: int, claimed: Callable[[], None] | None = None) -> None:
        """Start it and return once the start has ended; InsufficientMemory when it does
        not fit. `claimed` is called (from any thread) once it holds its memory."""
        ...

    async def wake(self, deployment_id: int) -> None: ...

    async def prepare(self, deployment_id: int) -> bool:
        """Pull its image and install its engine environment for a start (outside the
        controller's lock: minutes, for a large image or a compiled engine); False when
        that failed (the deployment failed)."""
        ...

    async def stop(
        self,
        deployment_id: int,
        precheck: Callable[[View], bool],
        reason: str,
        room_for: int | None = None,
    ) -> bool:
        """Stop (or put to sleep) an idle deployment; `room_for`: to make room for that
        deployment's start, which the stop must still be needed for."""
        ...

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
    # The requests queued now, by waiter, with when each first arrived in the queue (wall
    # time): a waiter leaves and comes back at each look, and keeps its first time.
    queued_at: dict[int, float] = field(default_factory=dict)
    last_request_at: float | None = None  # wall time, for status
    idle_since: float = 0.0  # clock time the idle timer last restarted
    attempt: asyncio.Task[StartOutcome] | None = None
    starting_for_request: bool = False
    backoff_s: float = 0.0
    backoff_until: float = 0.0
    failure: str = ""
    failures_forgiven: int = 0  # the row's count as last seen: a new one voids the backoff
    lease_until: float = float("-inf")  # clock time our lease on the row runs out
    idle_timeout_s: float = 0.0  # the deployment's, as of its last grant
    lease_wall_until: float = float("-inf")  # our lease's end in wall time, as written
    timeout_recorded_at: float = float("-inf")
    priority: int = 0  # the deployment's class, as last read
    start_s: float | None = None  # its measured start, as last read
    attempt_began: float = 0.0  # clock time its last start attempt began
    waking: bool = False  # that attempt wakes it (no estimate: a wake is no start)
    # Its recent use (slots granted, decayed: policy.decayed_uses) as of `used_at` (clock).
    uses: float = 0.0
    used_at: float = 0.0
    # The requests waiting for a slot of it now (queued or following a start), by waiter.
    waiters: dict[int, Waiter] = field(default_factory=dict)

    def used(self, now: float) -> None:
        self.uses = decayed_uses(self.uses, now - self.used_at) + 1.0
        self.used_at = now

    def uses_at(self, now: float) -> float:
        return decayed_uses(self.uses, now - self.used_at)

    def rank(self, now: float, aging_s: float) -> float | None:
        """Its best waiting request's place in the queue (common.priority.rank); None: no
        request waits."""
        return max(
            (rank(w.priority, now - w.arrived, aging_s) for w in self.waiters.values()),
            default=None,
        )

    def queue_in(self, waiter: Waiter) -> None:
        if waiter.queued_at is None:
            waiter.queued_at = time.time()
        self.queued_at[id(waiter)] = waiter.queued_at

    def queue_out(self, waiter: Waiter) -> None:
        self.queued_at.pop(id(waiter), None)

    @property
    def queued(self) -> int:
        return len(self.queued_at)

    @property
    def queued_since(self) -> float | None:
        """When the longest-waiting request queued now arrived."""
        return min(self.queued_at.values(), default=None)


@dataclass
class Waiter:
    """One request waiting for a slot."""

    deadline: float  # clock time it gives up (queue_timeout)
    on_queued: Callable[[], Any] | None
    attempt: asyncio.Task[StartOutcome] | None = None  # the start it follows, until it ends
    told_queued: bool = False
    queued_at: float | None = None  # wall time it first queued
    priority: int = 0  # its key's class plus its deployment's
    arrived: float = 0.0  # clock time it began to wait, for aging
    key_id: int | None = None  # whose: a key may hold at most max_waiting_per_key places
    # Refused while it waited: the queue was full and its key held the most of it.
    gives_way: bool = False


@dataclass
class Slot:
    deployment_id: int
    urls: tuple[str, ...] = ()
    released: bool = field(default=False)


LEASE_EXTRA_S = 30.0  # a lease runs this long past the idle timeout
LEASE_RENEW_S = 15.0  # and is renewed when less than this is left of that extra


def describe(entry: Entry, state: str | None) -> dict[str, Any]:
    """The seed's status: counts and the phase, in its order of precedence (a removed
    deployment, state None, reads as failed)."""
    if entry.queued:
        phase = Phase.QUEUED
    elif entry.attempt is not None and not entry.attempt.done():
        phase = Phase.STARTING_FOR_REQUEST
    elif entry.inflight:
        phase = Phase.SERVING
    elif state is None or state == State.FAILED:
        phase = Phase.FAILED
    elif state in SLEEPING:
        phase = Phase.SLEEPING
    else:
        phase = Phase.IDLE
    return {
        "inflight": entry.inflight,
        "queued": entry.queued,
        "queued_since": entry.queued_since,
        "last_request_at": entry.last_request_at,
        "phase": phase,
    }
