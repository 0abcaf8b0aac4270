"""The on-demand rules on their own (ondemand/policy.py): pure functions, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from common import priority
from deployments.placement import Demand, Device
from ondemand import policy
from ondemand.policy import Activity

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True)
class Model:
    name: str
    state: str
    need_gib: float
    held: tuple[tuple[int, float], ...] = ()
    evictable: bool = True
    recently_loaded: bool = False
    priority: int = 0
    holds: float | None = None  # what it holds now, where not need_gib (asleep)

    @property
    def frees_gib(self) -> float:
        return self.need_gib if self.holds is None else self.holds


IDLE = Activity(
    on_demand=True,
    state="ready",
    pending_mode=None,
    busy=False,
    idle_for_s=300.0,
    idle_timeout_s=300.0,
)


def test_it_calls_idle_only_what_meets_every_rule() -> None:
    assert policy.is_idle(IDLE)
    assert policy.is_idle(replace(IDLE, state="asleep"))
    assert not policy.is_idle(replace(IDLE, idle_for_s=299.9))
    assert not policy.is_idle(replace(IDLE, busy=True))
    assert not policy.is_idle(replace(IDLE, on_demand=False))
    assert not policy.is_idle(replace(IDLE, pending_mode="always_on"))
    assert not policy.is_idle(replace(IDLE, state="starting"))


def test_it_trusts_only_a_fresh_load_sample() -> None:
    assert policy.load_is_idle(0.0, True)
    assert not policy.load_is_idle(0.0, False)
    assert not policy.load_is_idle(policy.SAMPLE_MAX_AGE_S, True)
    assert not policy.load_is_idle(None, True)


def test_it_stops_the_least_recently_used_until_the_shortfall_is_covered() -> None:
    old, older, asleep, newest = (
        Model("old", "ready", 2),
        Model("older", "ready", 2),
        Model("asleep", "asleep", 8, holds=0.0),  # what it kept asleep was not measured
        Model("newest", "ready", 4),
    )
    idle = [(30.0, old), (10.0, older), (5.0, asleep), (50.0, newest)]

    def short(gib: float) -> Callable[[list[Model]], bool]:
        return lambda stopped: policy.room_after(None, gib, 0.0, (), stopped)

    assert policy.victims(idle, short(3)) == [older, old]  # the asleep one frees nothing
    assert policy.victims(idle, short(2)) == [older]
    assert policy.victims(idle, short(8)) == [older, old, newest]
    assert policy.victims(idle, short(8.5)) is None  # all of them cannot cover it: stop none
    # 5 GiB takes the newest too, and then the old one's 2 GiB are not needed: it is spared.
    assert policy.victims(idle, short(5)) == [older, newest]
    # A sleeper that keeps 1 GiB of its GPU memory gives it back when stopped: taken in
    # its turn (make-room gives sleepers no cost: they serve nothing).
    kept = replace(asleep, holds=1.0)
    sleepers = [(0.0, kept), (10.0, older), (30.0, old)]
    assert policy.victims(sleepers, short(1)) == [kept]
    assert policy.victims(sleepers, short(3)) == [kept, older]


def test_it_never_stops_a_pinned_deployment_to_make_room() -> None:
    pinned = Model("pinned", "ready", 6, evictable=False)
    loose = Model("loose", "ready", 2)
    idle = [(10.0, pinned), (20.0, loose)]  # the pinned one is the least recently used

    def short(gib: float) -> Callable[[list[Model]], bool]:
        return lambda stopped: policy.room_after(None, gib, 0.0, (), stopped)

    assert policy.victims(idle, short(2)) == [loose]
    assert policy.victims(idle, short(4)) is None  # only stopping the pinned one would do


def test_it_stops_a_recently_loaded_model_only_when_nothing_else_makes_room() -> None:
    fresh = Model("fresh", "ready", 2, recently_loaded=True)  # idle first, loaded just now
    old = Model("old", "ready", 2)
    idle = [(5.0, fresh), (10.0, old)]

    def short(gib: float) -> Callable[[list[Model]], bool]:
        return lambda stopped: policy.room_after(None, gib, 0.0, (), stopped)

    assert policy.victims(idle, short(2)) == [old]  # not the least recently used: no thrash
    assert policy.victims(idle, short(4)) == [old, fresh]  # both it takes, the fresh one last
    assert policy.victims(idle, short(5)) is None


def test_it_makes_room_only_on_the_gpus_the_start_can_use() -> None:
    """Two 80 GiB GPUs: an idle engine on each; the start needs 50 GiB on one GPU."""
    on_zero = Model("on-zero", "ready", 60, held=((0, 60.0),))
    on_one = Model("on-one", "ready", 40, held=((1, 40.0),))
    devices = (Device(0, 80.0, 20.0), Device(1, 80.0, 40.0))
    idle = [(10.0, on_zero), (20.0, on_one)]

    def room(demand: Demand) -> Callable[[list[Model]], bool]:
        return lambda stopped: policy.room_after(demand, 50.0, 60.0, devices, stopped)

    # The least recently used is on GPU 0, and stopping it alone makes room there.
    assert policy.victims(idle, room(Demand(gib=50.0))) == [on_zero]
    # 70 GiB: only GPU 0, emptied, holds it; GPU 1's engine is spared.
    assert policy.victims(idle, room(Demand(gib=70.0))) == [on_zero]
    # Tensor parallel over both GPUs, whole: both must go.
    both = policy.victims(idle, room(Demand(devices=2, share=1.0)))
    assert both == [on_zero, on_one]
    # Three GPUs' worth on a two-GPU host: no stop makes room.
    assert policy.victims(idle, room(Demand(devices=3, share=1.0))) is None
    # 40 GiB already fits on GPU 1: nobody is stopped.
    assert policy.victims(idle, room(Demand(gib=40.0))) == []

    # But an engine asleep on GPU 0 wakes there only: GPU 0's engine must go.
    def waking(demand: Demand) -> Callable[[list[Model]], bool]:
        return lambda stopped: policy.room_after(demand, 40.0, 60.0, devices, stopped, (0,))

    assert policy.victims(idle, waking(Demand(gib=40.0))) == [on_zero]


def test_it_doubles_the_backoff_up_to_fifteen_minutes() -> None:
    waits = [policy.next_backoff(0.0)]
    while waits[-1] < policy.BACKOFF_MAX_S:
        waits.append(policy.next_backoff(waits[-1]))
    assert waits == [60, 120, 240, 480, 900]
    assert policy.next_backoff(900) == 900


def test_it_admits_behind_the_head_only_beyond_what_was_freed_for_the_head() -> None:
    assert policy.admitted(None, free_gib=1, need_gib=1)  # no head
    assert policy.admitted(0, free_gib=3, need_gib=1)  # nothing was freed for the head
    assert policy.admitted(6, free_gib=10, need_gib=4)
    assert not policy.admitted(6, free_gib=10, need_gib=4.5)


def test_it_finds_the_next_idle_timer_to_run_out() -> None:
    timers = [(100.0, 600.0), (50.0, 60.0), (0.0, 0.0), (400.0, 300.0)]
    assert policy.next_idle_expiry(timers, now=200.0) == 700.0  # 110 has passed
    assert policy.next_idle_expiry([(50.0, 60.0)], now=200.0) is None


def test_it_calls_unused_what_has_nothing_in_flight_whatever_its_idle_timer() -> None:
    fresh = replace(IDLE, idle_for_s=1.0)
    assert policy.is_unused(fresh) and not policy.is_idle(fresh)
    assert policy.is_unused(replace(fresh, state="asleep"))
    assert not policy.is_unused(replace(fresh, busy=True))
    assert not policy.is_unused(replace(fresh, on_demand=False))
    assert not policy.is_unused(replace(fresh, pending_mode="always_on"))
    assert not policy.is_unused(replace(fresh, state="starting"))


def test_it_prices_a_stop_by_the_start_it_costs_and_the_use_it_loses() -> None:
    # Idle past its timeout: free (its reaper stops it anyway).
    assert policy.keep_cost(True, 90.0, 50.0, 8.0) == 0.0
    # Slow to start and busy lately costs more than quick and unused; per GiB freed.
    slow_busy = policy.keep_cost(False, 90.0, 20.0, 8.0)
    quick_unused = policy.keep_cost(False, 5.0, 0.0, 8.0)
    assert quick_unused < slow_busy
    assert policy.keep_cost(False, 30.0, 1.0, 70.0) < policy.keep_cost(False, 30.0, 1.0, 8.0)
    # Never measured: taken as a minute.
    assert policy.keep_cost(False, None, 1.0, 8.0) == policy.keep_cost(False, 60.0, 1.0, 8.0)
    # Use decays by half every USE_HALF_LIFE_S.
    assert policy.decayed_uses(8.0, policy.USE_HALF_LIFE_S * 2) == 2.0


def test_it_stops_the_cheapest_first_and_never_a_model_of_a_higher_class() -> None:
    cheap, dear, vip = (
        Model("cheap", "ready", 4),
        Model("dear", "ready", 4),
        Model("vip", "ready", 4, priority=10),
    )
    priced = [(9.0, dear), (0.5, vip), (1.0, cheap)]

    def short(gib: float) -> Callable[[list[Model]], bool]:
        return lambda stopped: policy.room_after(None, gib, 0.0, (), stopped)

    assert policy.victims(priced, short(4)) == [vip]  # no ceiling: the cheapest
    assert policy.victims(priced, short(4), ceiling=0) == [cheap]  # a normal request
    assert policy.victims(priced, short(8), ceiling=0) == [cheap, dear]
    assert policy.victims(priced, short(12), ceiling=0) is None  # only the VIP's would do
    assert policy.victims(priced, short(12), ceiling=10) == [vip, cheap, dear]


def test_it_ages_a_waiting_request_one_class_per_aging_period() -> None:
    assert priority.rank(-10, 0.0, 120.0) == -10.0
    assert priority.rank(-10, 119.0, 120.0) == -10.0  # in whole steps
    assert priority.rank(-10, 120.0, 120.0) == 0.0
    # A low request that waited twice the period ties a fresh high one, and then passes it.
    assert priority.rank(-10, 240.0, 120.0) == priority.rank(10, 0.0, 120.0)
    assert priority.rank(-10, 360.0, 120.0) > priority.rank(10, 0.0, 120.0)
    assert priority.rank(-10, 10_000.0, 0.0) == -10.0  # no aging


def test_it_counts_loaded_models_against_the_cap() -> None:
    assert policy.within_cap(3, 0, 0)  # no cap
    assert policy.within_cap(2, 3, 0)
    assert not policy.within_cap(3, 3, 0)
    assert policy.within_cap(3, 3, 1)  # one of them stopped
