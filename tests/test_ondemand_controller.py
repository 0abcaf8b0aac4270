"""The on-demand controller as a state machine, against a fake deployer and a fake clock:
every branch in seconds, with no sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import replace
from typing import Any

import pytest

from deployments.engine_metrics import Load
from ondemand.controller import Controller
from ondemand.state import Slot
from openai_api.errors import GatewayError
from tests.fake_clock import FakeClock, settle
from tests.ondemand_fakes import FakeDeployer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def deployer(clock: FakeClock) -> FakeDeployer:
    return FakeDeployer(clock)


@pytest.fixture
def controller(deployer: FakeDeployer, clock: FakeClock) -> Controller:
    return Controller(deployer, clock, queue_timeout_s=900, max_queued=100)


@pytest.fixture
def seed_controller(deployer: FakeDeployer, clock: FakeClock) -> Controller:
    """MSHIP_MAKE_ROOM_FROM=idle: make-room stops only models idle for their whole timeout."""
    return Controller(deployer, clock, queue_timeout_s=900, max_queued=100, evict_unused=False)


def acquiring(controller: Controller, id: int, **kw: Any) -> asyncio.Task[Slot]:
    return asyncio.ensure_future(controller.acquire(id, **kw))


async def code_of(task: asyncio.Task[Any]) -> str:
    with pytest.raises(GatewayError) as failure:
        await task
    return failure.value.code


async def test_it_grants_a_slot_at_once_when_ready(
    controller: Controller, deployer: FakeDeployer
) -> None:
    view = deployer.add(1, "a", 2, state="ready")
    slot = await controller.acquire(1)
    assert controller.status(view, 1)["phase"] == "serving"
    controller.release(slot)
    controller.release(slot)  # twice is harmless
    assert controller.status(view, 1) | {"last_request_at": None} == {
        "inflight": 0,
        "queued": 0,
        "queued_since": None,
        "last_request_at": None,
        "phase": "idle",
    }


async def test_it_starts_a_model_once_for_a_burst_of_first_requests(
    controller: Controller, deployer: FakeDeployer
) -> None:
    deployer.add(1, "a", 2)
    waiters = [acquiring(controller, 1) for _ in range(50)]
    await settle()
    assert deployer.starts == ["a"]
    assert controller.status(deployer.rows[1], 1)["phase"] == "starting_for_request"
    deployer.finish(1)
    slots = await asyncio.gather(*waiters)
    assert len(slots) == 50 and deployer.starts == ["a"]
    assert controller.entry(1).inflight == 50


async def test_it_wakes_an_asleep_model(controller: Controller, deployer: FakeDeployer) -> None:
    deployer.add(1, "a", 2, state="asleep")
    waiter = acquiring(controller, 1)
    await settle()
    deployer.finish(1)
    assert isinstance(await waiter, Slot)


async def test_it_starts_another_model_while_one_installs_its_engine(
    controller: Controller, deployer: FakeDeployer
) -> None:
    """A start's install (minutes) runs outside the controller's lock: another model starts
    and serves meanwhile. A failed install fails the start that waited for it."""
    deployer.add(1, "painter", 2)
    deployer.add(2, "chat", 2)
    deployer.add(3, "broken", 2)
    for held in (1, 3):
        deployer.installs[held] = asyncio.get_running_loop().create_future()
    painting = acquiring(controller, 1)
    await settle()
    assert controller.status(deployer.rows[1], 1)["phase"] == "starting_for_request"
    chatting = acquiring(controller, 2)
    await settle()
    assert deployer.starts == ["chat"]  # not behind painter's install
    deployer.finish(2)
    assert isinstance(await chatting, Slot) and not painting.done()
    deployer.installs[1].set_result(True)
    await settle()
    deployer.finish(1)
    assert isinstance(await painting, Slot)
    broken = acquiring(controller, 3)
    await settle()
    deployer.installs[3].set_result(False)
    assert await code_of(broken) == "start_failed"
    assert deployer.starts == ["chat", "painter"]


async def test_it_fails_waiters_and_backs_off_after_a_failed_start(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "a", 2)
    waiters = [acquiring(controller, 1) for _ in range(3)]
    await settle()
    deployer.finish(1, "failed")
    assert [await code_of(w) for w in waiters] == ["start_failed"] * 3
    # Refused at once for 60 s, without a new start.
    assert await code_of(acquiring(controller, 1)) == "start_failed"
    assert deployer.starts == ["a"]
    await clock.advance(61)
    again = acquiring(controller, 1)
    await settle()
    deployer.finish(1, "failed")
    assert await code_of(again) == "start_failed"
    assert controller.entry(1).backoff_s == 120  # doubled
    await clock.advance(121)
    third = acquiring(controller, 1)
    await settle()
    deployer.finish(1)
    await third
    assert controller.entry(1).backoff_s == 0  # a success resets it


async def test_it_tells_a_start_failure_only_to_the_requests_that_waited_on_it(
    controller: Controller, deployer: FakeDeployer
) -> None:
    deployer.add(1, "a", 2)
    waiter = acquiring(controller, 1)
    await settle()
    waiter.cancel()  # it hangs up; the start it asked for goes on, and fails
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    deployer.finish(1, "failed")
    await settle()
    controller.reset_backoff(1)  # fixed and forgiven (a mode switch, a new configuration)
    # The next request starts it again rather than hearing of the old failure.
    fixed = acquiring(controller, 1)
    await settle()
    assert deployer.starts == ["a", "a"]
    deployer.finish(1)
    assert (await fixed).deployment_id == 1


async def test_it_tells_waiters_when_the_model_is_stopped_while_it_starts(
    controller: Controller, deployer: FakeDeployer
) -> None:
    deployer.add(1, "a", 2)
    waiter = acquiring(controller, 1)
    await settle()
    deployer.set_state(1, "stopped")  # an administrator's Stop
    deployer.finish(1)
    assert await code_of(waiter) == "ondemand_stopped"
    assert controller.entry(1).backoff_s == 0  # not a start failure
    retry = acquiring(controller, 1)
    await settle()
    assert deployer.starts == ["a", "a"]
    deployer.finish(1)
    await retry


async def test_it_refuses_beyond_the_queue_limit(deployer: FakeDeployer, clock: FakeClock) -> None:
    controller = Controller(deployer, clock, max_queued=2)
    deployer.add(1, "a", 2)
    first, second = acquiring(controller, 1), acquiring(controller, 1)
    await settle()
    with pytest.raises(GatewayError) as refused:
        await controller.acquire(1)
    assert (refused.value.status, refused.value.code) == (503, "ondemand_queue_full")
    assert refused.value.headers == {"retry-after": "60"}  # the seed's Retry-After: 60
    deployer.finish(1)
    await asyncio.gather(first, second)


async def test_it_says_does_not_fit_at_once_for_a_model_bigger_than_the_budget(
    controller: Controller, deployer: FakeDeployer, caplog: pytest.LogCaptureFixture
) -> None:
    deployer.add(1, "pinned", 4, state="ready", on_demand=False)
    deployer.always_on.add(1)
    deployer.add(2, "huge", 7)
    assert await code_of(acquiring(controller, 2)) == "does_not_fit"
    assert deployer.starts == []
    await settle()
    gc.collect()
    # The refusal was read where it was answered: asyncio logs no unread failure for it.
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_it_refuses_a_model_that_can_never_fit_before_preparing_its_start(
    controller: Controller, deployer: FakeDeployer
) -> None:
    """does_not_fit is at once: no image pulled, no engine environment installed for a start
    that cannot fit; one that fits once room is made is prepared as before."""
    deployer.add(1, "pinned", 4, state="ready", on_demand=False)
    deployer.always_on.add(1)
    deployer.add(2, "huge", 7)
    deployer.add(3, "fits", 6)
    assert await code_of(acquiring(controller, 2)) == "does_not_fit"
    assert deployer.prepared == []
    fits = acquiring(controller, 3)
    await settle()
    assert deployer.prepared == ["fits"]
    deployer.finish(3)
    controller.release(await fits)


async def served_in_turn(controller: Controller, clock: FakeClock, *ids: int) -> None:
    """One request to each deployment, 10 s apart: the first is the least recently used."""
    for n, deployment_id in enumerate(ids):
        if n:
            await clock.advance(10)
        controller.release(await controller.acquire(deployment_id))


async def test_it_makes_room_by_stopping_the_least_recently_used_idle_model(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "older", 4, state="ready")
    deployer.add(2, "newer", 4, state="ready")
    deployer.add(3, "busy", 2, state="ready")
    await served_in_turn(controller, clock, 1, 2)
    busy = await controller.acquire(3)  # in flight: never a victim
    await clock.advance(700)  # everyone idle past the timeout
    deployer.add(4, "new", 4)
    waiter = acquiring(controller, 4)
    await settle()
    assert deployer.stops == [("older", "Put to sleep to make room for new")]
    deployer.finish(4)
    await waiter
    controller.release(busy)


async def test_it_makes_room_around_a_pinned_model(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "pinned", 4, state="ready", evictable=False)
    deployer.add(2, "loose", 4, state="ready")
    await served_in_turn(controller, clock, 1, 2)  # the pinned one, the least recently used
    await clock.advance(700)  # both idle past the timeout
    deployer.add(3, "new", 4)
    waiter = acquiring(controller, 3)
    await settle()
    assert deployer.stops == [("loose", "Put to sleep to make room for new")]
    deployer.finish(3)
    await waiter
    # With the loose one gone too, nothing but the pinned one would make room: it waits.
    deployer.add(4, "newest", 4)
    queued = acquiring(controller, 4)
    await settle()
    assert controller.status(deployer.rows[4], 4)["phase"] == "queued"
    assert [name for name, _ in deployer.stops] == ["loose"]
    queued.cancel()
    await settle()


async def test_it_never_picks_a_model_that_is_not_idle_by_every_rule(
    seed_controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    controller = seed_controller
    deployer.add(1, "recent", 3, state="ready")
    deployer.add(2, "loaded", 3, state="ready")
    deployer.add(3, "stale-sample", 3, state="ready")
    await clock.advance(700)
    controller.release(await controller.acquire(1))  # its idle timer restarts now
    deployer.loads[2] = (clock.now(), Load(running=1, waiting=0))
    deployer.loads[3] = (clock.now() - 120, Load(0, 0))  # older than 60 s
    deployer.add(4, "new", 3)
    queued: list[int] = []
    waiter = acquiring(controller, 4, on_queued=lambda: queued.append(1))
    await settle()
    assert deployer.stops == [] and queued == [1]
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter


async def test_it_queues_until_memory_is_freed_and_notifies_once(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "serving", 8, state="ready")
    busy = await controller.acquire(1)
    deployer.add(2, "waiting", 4)
    notices: list[int] = []
    waiter = acquiring(controller, 2, on_queued=lambda: notices.append(1))
    await settle()
    status = controller.status(deployer.rows[2], 2)
    assert status["phase"] == "queued" and status["queued_since"] is not None
    await clock.advance(15)  # it looks again, still no room
    assert notices == [1] and not waiter.done()
    # It waits since it first queued, however often it looked again; a later one waits less.
    later = acquiring(controller, 2)
    await settle()
    await clock.advance(15)
    again = controller.status(deployer.rows[2], 2)
    assert again["queued"] == 2 and again["queued_since"] == status["queued_since"]
    later.cancel()
    await settle()
    controller.release(busy)
    deployer.set_state(1, "stopped")  # an operator stops it; the change wakes the waiter
    controller.notify()
    await settle()
    deployer.finish(2)
    await waiter
    assert notices == [1]


async def test_it_times_out_a_request_that_waits_too_long(
    deployer: FakeDeployer, clock: FakeClock
) -> None:
    controller = Controller(deployer, clock, queue_timeout_s=60)
    deployer.add(1, "serving", 8, state="ready")
    await controller.acquire(1)
    deployer.add(2, "waiting", 4)
    waiters = [acquiring(controller, 2) for _ in range(3)]
    await settle()
    for _ in range(5):
        await clock.advance(15)
    assert [await code_of(w) for w in waiters] == ["ondemand_queue_timeout"] * 3
    assert deployer.timeouts == [(2, 60)]  # one audit row for the three


async def test_it_starts_nothing_when_the_waiter_hung_up(
    controller: Controller, deployer: FakeDeployer
) -> None:
    deployer.add(1, "first", 2)
    async with controller.lock:  # another start's claim is under way
        first = acquiring(controller, 1)
        await settle()  # its attempt waits for the lock
        assert controller.entry(1).attempt is not None
        first.cancel()  # its only waiter hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await first
    await settle()
    assert deployer.starts == []  # the abandoned attempt started nothing


async def test_it_starts_a_second_model_while_the_first_waits_for_its_engine(
    controller: Controller, deployer: FakeDeployer
) -> None:
    """The lock covers a start's claim on memory, not its engine's health wait: a start (or a
    wake) of another model goes on meanwhile, and ends first if its engine is quicker."""
    deployer.add(1, "slow", 2)
    deployer.add(2, "quick", 2)
    deployer.add(3, "sleeper", 2, state="asleep")
    slow = acquiring(controller, 1)
    await settle()
    quick = acquiring(controller, 2)
    woken = acquiring(controller, 3)
    await settle()
    assert deployer.starts == ["slow", "quick", "sleeper"]  # all three at once
    deployer.finish(3)
    deployer.finish(2)
    assert (await woken).deployment_id == 3 and (await quick).deployment_id == 2
    assert not slow.done()  # still waiting for its engine
    deployer.finish(1)
    assert (await slow).deployment_id == 1


async def test_it_starts_a_small_model_while_the_head_waits_for_memory_nobody_freed(
    controller: Controller, deployer: FakeDeployer
) -> None:
    """Capacity 10: a busy 7 GiB model; 6 GiB queues first (nothing could be freed for it),
    then 1 GiB arrives. 3 GiB are free and none of it was freed for the head: the small one
    starts at once (the seed), and the head starts once the busy one stops."""
    deployer.add(1, "busy", 7, state="ready")
    busy = await controller.acquire(1)
    deployer.add(2, "big", 6)
    deployer.add(3, "small", 1)
    big = acquiring(controller, 2)
    await settle()
    assert list(controller.queue) == [2] and deployer.starts == []
    small = acquiring(controller, 3)
    await settle()
    assert deployer.starts == ["small"] and list(controller.queue) == [2]
    deployer.finish(3)
    controller.release(await small)
    controller.release(busy)
    deployer.set_state(1, "stopped")
    controller.notify()
    await settle()
    assert deployer.starts == ["small", "big"]
    deployer.finish(2)
    controller.release(await big)
    assert controller.queue == {} and controller.freed_for == {}


async def test_it_keeps_the_memory_freed_for_the_head_of_the_queue(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    """Capacity 10: busy 3 GiB, idle 4 GiB, 3 GiB free. The 6 GiB head stops the idle one
    for itself, but its memory is slow to show, so the head queues with 4 GiB freed for it.
    A 2 GiB model that would fit in the 3 GiB free now waits: 3 - 4 leaves it nothing."""
    deployer.slow_release = True
    deployer.add(1, "busy", 3, state="ready")
    deployer.add(2, "idle", 4, state="ready")
    busy = await controller.acquire(1)
    controller.release(await controller.acquire(2))
    await clock.advance(700)
    deployer.add(3, "big", 6)
    deployer.add(4, "small", 2)
    big = acquiring(controller, 3)
    await settle()
    assert deployer.stops == [("idle", "Put to sleep to make room for big")]
    for _ in range(25):  # the make-room settle wait runs out: the freed memory never showed
        await clock.advance(1)
    assert list(controller.queue) == [3] and controller.freed_for == {3: 4.0}
    small = acquiring(controller, 4)
    await settle()
    assert deployer.starts == [] and list(controller.queue) == [3, 4]
    deployer.release(2)  # the idle one's memory shows at last
    controller.notify()
    await settle()
    assert deployer.starts == ["big"]  # the head first; 1 GiB is left, the small one waits
    deployer.finish(3)
    controller.release(await big)
    assert controller.freed_for == {} and list(controller.queue) == [4]
    controller.release(busy)
    deployer.set_state(1, "stopped")
    controller.notify()
    await settle()
    assert deployer.starts == ["big", "small"]
    deployer.finish(4)
    controller.release(await small)


async def test_it_waits_for_a_start_that_a_switch_to_always_on_runs(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "switching", 2, pending_mode="always_on")
    waiter = acquiring(controller, 1)
    await settle()
    await clock.advance(15)
    assert deployer.starts == [] and not waiter.done()  # set_mode's start, not ours
    deployer.rows[1] = replace(deployer.rows[1], state="ready", pending_mode=None)
    controller.notify()
    slot = await waiter
    controller.release(slot)


async def test_it_keeps_the_model_a_full_idle_timeout_after_the_last_byte_of_a_long_stream(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    """A stream that lasts most of the idle timeout: its lease is renewed as it runs, and
    its end restarts the idle timer for the reaper too, which reads only the row's lease."""
    deployer.add(1, "long", 2, state="ready", idle_timeout_s=300)
    slot = await controller.acquire(1)
    for _ in range(38):  # 285 s of streaming, with the renewer's pass every 7.5 s
        await clock.advance(7.5)
        await controller.renew_leases()
    writes = len(deployer.holds)
    controller.release(slot)
    await settle()
    assert deployer.leases[1] >= clock.now() + 300  # a full idle timeout from the last byte
    assert len(deployer.holds) == writes + 1  # one write for the burst's end
    # A second burst right after needs no write: the lease already covers it.
    controller.release(await controller.acquire(1))
    await settle()
    assert len(deployer.holds) == writes + 1


async def test_it_looks_again_the_moment_a_victims_idle_timeout_runs_out(
    seed_controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    controller = seed_controller
    deployer.add(1, "resting", 6, state="ready", idle_timeout_s=600)
    controller.release(await controller.acquire(1))
    await clock.advance(590)  # idle for 590 of its 600 s: not a victim yet
    deployer.add(2, "big", 6)
    big = acquiring(controller, 2)
    await settle()
    assert list(controller.queue) == [2] and deployer.stops == []
    await clock.advance(10)  # its timeout runs out now, before the 15 s poll
    assert deployer.stops == [("resting", "Put to sleep to make room for big")]
    assert deployer.starts == ["big"]
    deployer.finish(2)
    controller.release(await big)


async def test_it_answers_start_failed_when_a_switch_to_always_on_failed_to_start(
    controller: Controller, deployer: FakeDeployer
) -> None:
    deployer.add(1, "switching", 2, pending_mode="always_on")
    waiter = acquiring(controller, 1)
    await settle()
    assert not waiter.done()  # the switch's start runs: the request waits for it
    # The switch's start failed: the switch is applied, the deployment is always on, failed.
    deployer.rows[1] = replace(deployer.rows[1], state="failed", on_demand=False, pending_mode=None)
    controller.notify()
    assert await code_of(waiter) == "start_failed"
    assert await code_of(acquiring(controller, 1)) == "start_failed"
    assert deployer.starts == []  # no request restarted the always-on deployment itself


async def test_it_makes_room_by_stopping_an_idle_engine_that_has_no_load_gauges(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "voice", 6, state="ready", gauged=False, idle_timeout_s=300)
    controller.release(await controller.acquire(1))
    await clock.advance(301)
    deployer.add(2, "chat", 6)
    waiter = acquiring(controller, 2)
    await settle()
    assert deployer.stops == [("voice", "Put to sleep to make room for chat")]
    deployer.finish(2)
    controller.release(await waiter)


async def test_it_never_makes_room_with_a_model_another_process_holds_a_lease_on(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    """Idle here, but another gateway process (or an operator's start) renewed its lease."""
    deployer.add(1, "shared", 6, state="ready", idle_timeout_s=300)
    controller.release(await controller.acquire(1))
    await clock.advance(301)
    elsewhere = time.time() + 600
    deployer.rows[1] = replace(deployer.rows[1], lease_until=elsewhere)
    deployer.add(2, "big", 6)
    big = acquiring(controller, 2)
    await settle()
    assert deployer.stops == [] and list(controller.queue) == [2]
    deployer.rows[1] = replace(deployer.rows[1], lease_until=time.time() - 1)  # it lapsed
    controller.notify()
    await settle()
    assert deployer.stops == [("shared", "Put to sleep to make room for big")]
    deployer.finish(2)
    controller.release(await big)


async def test_it_answers_a_removal_while_waiting_by_what_the_request_waited_for(
    controller: Controller, deployer: FakeDeployer
) -> None:
    deployer.add(1, "starting-for-it", 2)
    waiter = acquiring(controller, 1)
    await settle()
    del deployer.rows[1]  # removed while it started for this request
    deployer.finish(1)
    assert await code_of(waiter) == "ondemand_stopped"

    deployer.add(2, "started-by-hand", 2, state="starting")
    waiter = acquiring(controller, 2)
    await settle()
    del deployer.rows[2]  # removed while the request only waited
    controller.notify()
    assert await code_of(waiter) == "not_found"


async def test_it_waits_untold_for_a_start_another_process_makes(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    """Another gateway process took the start-up gate first and is starting the model: this
    process's requests wait for that start, with no memory notice, and start nothing."""
    deployer.add(1, "shared", 2, state="starting")
    told: list[int] = []
    waiter = acquiring(controller, 1, on_queued=lambda: told.append(1))
    await settle()
    assert deployer.starts == [] and not waiter.done()
    deployer.set_state(1, "ready")
    controller.notify()
    slot = await waiter
    assert told == [] and deployer.starts == []
    controller.release(slot)


async def test_it_counts_a_stop_under_way_as_room_being_made(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    """Another process is stopping a victim for the same start: this one stops nothing more
    and waits for the memory to show."""
    deployer.add(1, "being-stopped", 5, state="stopping")
    deployer.add(2, "idle", 5, state="ready", idle_timeout_s=60.0)
    controller.entry(2)  # its idle timer starts
    await clock.advance(120)
    deployer.add(3, "new", 5)
    waiter = acquiring(controller, 3)
    await settle()
    assert deployer.stops == [] and deployer.starts == []
    deployer.set_state(1, "stopped")
    controller.notify()
    await settle()
    assert deployer.starts == ["new"]
    deployer.finish(3)
    controller.release(await waiter)


async def test_it_caps_one_keys_waiting_requests_in_the_on_demand_queue(
    controller: Controller, deployer: FakeDeployer
) -> None:
    controller.max_waiting_per_key = 2
    deployer.add(1, "cold", 2)
    waiting = [acquiring(controller, 1, key_id=7) for _ in range(2)]
    await settle()
    assert await code_of(acquiring(controller, 1, key_id=7)) == "too_many_waiting_requests"
    other = acquiring(controller, 1, key_id=8)  # another key's request still waits
    await settle()
    deployer.finish(1)
    slots = [await task for task in [*waiting, other]]
    assert [slot.deployment_id for slot in slots] == [1, 1, 1]
    assert deployer.starts == ["cold"]


async def test_it_makes_a_full_queue_refuse_the_key_holding_most_of_it(
    deployer: FakeDeployer, clock: FakeClock
) -> None:
    """The queue is full of one key's burst: another key's request takes the burst's latest
    place (429 to it), instead of every other key getting 503."""
    controller = Controller(deployer, clock, max_queued=3)
    deployer.add(1, "cold", 2)
    burst = [acquiring(controller, 1, key_id=7) for _ in range(3)]
    await settle()
    other = acquiring(controller, 1, key_id=8)
    await settle()
    assert await code_of(burst[-1]) == "too_many_waiting_requests"
    assert not other.done() and not burst[0].done()
    # A third key's request: 7 holds 2, 8 would hold 1 with it: 7's latest gives way again.
    third = acquiring(controller, 1, key_id=9)
    await settle()
    assert await code_of(burst[1]) == "too_many_waiting_requests"
    # Now each holds one: the newcomer of any key is refused, as the seed's full queue is.
    with pytest.raises(GatewayError) as refused:
        await controller.acquire(1, key_id=10)
    assert (refused.value.status, refused.value.code) == (503, "ondemand_queue_full")
    deployer.finish(1)
    slots = [await task for task in (burst[0], other, third)]
    assert [slot.deployment_id for slot in slots] == [1, 1, 1]
