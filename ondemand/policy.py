"""The on-demand rules, apart from the machinery that applies them (on-demand seed,
"Controller", and the scheduler's issue): when a deployment is idle or unused, which ones make
room and at what cost, how long a failed start holds the next one back, which start the queue
admits and in what order, and the words for phases and start outcomes.

Pure functions of what they are given: no database, no clock, no await. The gateway's
controller and the cluster's reaper both decide with them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, TypeVar

from deployments import placement
from deployments.models import State

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from deployments.placement import Demand, Device

BACKOFF_FIRST_S = 60.0
BACKOFF_MAX_S = 900.0
SAMPLE_MAX_AGE_S = 60.0  # an engine's load sample older than this proves nothing
EPSILON_GIB = 1e-9  # memory sums compare with this slack
USE_HALF_LIFE_S = 900.0  # a model's recent use counts half after 15 minutes
START_S_UNMEASURED = 60.0  # what a start is taken to cost before one was measured


class Phase(StrEnum):
    """An on-demand deployment's phase, as its status shows it (the seed's words)."""

    QUEUED = "queued"
    STARTING_FOR_REQUEST = "starting_for_request"
    SERVING = "serving"
    FAILED = "failed"
    SLEEPING = "sleeping"
    IDLE = "idle"


class StartOutcome(StrEnum):
    """How one start attempt, shared by every request that waits on it, ended."""

    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped or removed meanwhile: its waiters get ondemand_stopped
    QUEUED = "queued"  # no memory now: its waiters queue
    # Another gateway process (or an operator) is starting it: its waiters wait for that
    # start, with no memory notice.
    ELSEWHERE = "elsewhere"
    NOBODY = "nobody"  # every waiter left before it began: nothing was started


@dataclass(frozen=True)
class Activity:
    """What the idle rules read of one deployment."""

    on_demand: bool
    state: str
    pending_mode: str | None
    busy: bool  # a slot in flight or a request waiting for one
    idle_for_s: float  # since the idle timer last restarted
    idle_timeout_s: float


def is_idle(activity: Activity) -> bool:
    """On demand, ready or asleep, no mode switch waiting, nothing in flight or waiting,
    and idle for its whole timeout."""
    return (
        activity.on_demand
        and activity.pending_mode is None
        and activity.state in (State.READY, State.ASLEEP)
        and not activity.busy
        and activity.idle_for_s >= activity.idle_timeout_s
    )


def is_unused(activity: Activity) -> bool:
    """What make-room may stop: on demand, ready or asleep, no mode switch waiting, and
    nothing in flight or waiting now (its idle timer need not have run out)."""
    return (
        activity.on_demand
        and activity.pending_mode is None
        and activity.state in (State.READY, State.ASLEEP)
        and not activity.busy
    )


def load_is_idle(sample_age_s: float | None, engine_idle: bool) -> bool:
    """The engine's own word: a fresh sample showing nothing running or waiting."""
    return sample_age_s is not None and sample_age_s < SAMPLE_MAX_AGE_S and engine_idle


class Candidate(Protocol):
    """A deployment that could be stopped to make room."""

    @property
    def state(self) -> str: ...

    @property
    def need_gib(self) -> float: ...

    @property
    def frees_gib(self) -> float: ...

    @property
    def held(self) -> tuple[tuple[int, float], ...]: ...

    @property
    def evictable(self) -> bool: ...

    @property
    def recently_loaded(self) -> bool: ...

    @property
    def priority(self) -> int: ...


C = TypeVar("C", bound=Candidate)


def victims(
    candidates: Sequence[tuple[float, C]],
    covers: Callable[[list[C]], bool],
    ceiling: float | None = None,
) -> list[C] | None:
    """The deployments to stop, cheapest first (each given with its cost, `keep_cost`),
    until stopping them `covers` the start; None when all of them cannot. Those recently
    loaded come last: stopped only when the others do not make room (no thrash); pinned ones
    and those of a class above `ceiling` (the requester's) never. Then any of them the start
    does not need is spared, newest first: on a GPU host, an engine on a device the start
    cannot use frees nothing for it."""
    chosen: list[C] = []
    for _, candidate in sorted(candidates, key=lambda pair: (pair[1].recently_loaded, pair[0])):
        if covers(chosen):
            break
        if not candidate.evictable:
            continue  # pinned: never stopped to make room
        if ceiling is not None and candidate.priority > ceiling:
            continue  # a request never stops a model of a higher class
        chosen.append(candidate)
    if not covers(chosen):
        return None
    for candidate in reversed(list(chosen)):
        spared = [c for c in chosen if c is not candidate]
        if covers(spared):
            chosen = spared
    return chosen


def keep_cost(past_timeout: bool, start_s: float | None, uses: float, need_gib: float) -> float:
    """What stopping a model costs, per GiB it frees: the seconds it takes to start again
    (measured; a minute before any was), weighed by how much it was used lately (`uses`,
    decayed: `decayed_uses`). One idle past its timeout costs nothing: its reaper stops it
    anyway. Make-room stops the cheapest first, so a large, rarely used model that starts
    quickly goes before a small, busy one that takes minutes to load."""
    if past_timeout:
        return 0.0
    seconds = START_S_UNMEASURED if start_s is None else max(start_s, 1.0)
    return seconds * (uses + 0.1) / max(need_gib, 0.5)


def decayed_uses(uses: float, since_s: float) -> float:
    """A use count `since_s` after it was last counted, halved every USE_HALF_LIFE_S."""
    return float(uses * 0.5 ** (max(since_s, 0.0) / USE_HALF_LIFE_S))


def within_cap(loaded: int, cap: int, stopping: int) -> bool:
    """Whether one more model may be loaded under a cap on loaded models (0: none) once
    `stopping` of the `loaded` ones are stopped."""
    return cap <= 0 or loaded - stopping < cap


def room_after(
    demand: Demand | None,
    need_gib: float,
    free_gib: float,
    devices: Sequence[Device],
    stopped: Sequence[Candidate],
    where: Sequence[int] = (),
) -> bool:
    """Whether the start fits once `stopped` release what they hold: on a GPU host, placed
    on the devices as they would be (`demand` there), only on `where` for an engine asleep
    on those GPUs (its wake cannot move it); in one pool, by the sum."""
    if not devices or demand is None:
        return free_gib + sum(c.frees_gib for c in stopped) + EPSILON_GIB >= need_gib
    released = [held for c in stopped for held in c.held]
    usable = [d for d in placement.freed(devices, released) if not where or d.index in where]
    return placement.fits(demand, usable)


LEASE_SLACK_S = 2.0  # a row's lease this close to the end of ours is ours


def leased_elsewhere(row_lease_until: float | None, ours_until: float) -> bool:
    """The row's lease (wall time) runs beyond ours: another gateway process holds or just
    released a slot, or the idle timer restarted outside this process (an operator's start,
    an adoption after a restart, a switch to on demand)."""
    if row_lease_until is None or row_lease_until <= time.time():
        return False
    return row_lease_until > ours_until + LEASE_SLACK_S


def next_idle_expiry(timers: Iterable[tuple[float, float]], now: float) -> float | None:
    """The next moment one of the idle timers (each restarted at a time, with its timeout)
    runs out after `now`: a queued request looks again then, as a victim may be free."""
    due = [since + timeout for since, timeout in timers if timeout > 0 and since + timeout > now]
    return min(due, default=None)


def next_backoff(previous_s: float) -> float:
    """How long a failed start holds the next one back: doubling, from a minute to 15."""
    return BACKOFF_FIRST_S if not previous_s else min(previous_s * 2, BACKOFF_MAX_S)


def admitted(freed_for_head_gib: float | None, free_gib: float, need_gib: float) -> bool:
    """Whether a deployment behind the head of the memory queue may start: only within the
    memory free now minus what was freed for the head (reserved for it until it starts or
    gives up). No head, or the deployment is the head: None, yes."""
    if freed_for_head_gib is None:
        return True
    return free_gib - freed_for_head_gib + EPSILON_GIB >= need_gib
