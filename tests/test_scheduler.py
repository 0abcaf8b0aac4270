"""The scheduler's decisions in the controller, on the fake clock: a swap stops an unused
model (the cheapest to bring back first), the queue serves higher classes first and ages the
lower ones, a request never stops a model of a higher class, and the cap on loaded models
counts like memory."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from ondemand.controller import Controller
from openai_api.errors import GatewayError
from tests.fake_clock import FakeClock, settle
from tests.ondemand_fakes import FakeDeployer

if TYPE_CHECKING:
    from ondemand.state import Slot

HIGH, NORMAL, LOW = 10, 0, -10


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def deployer(clock: FakeClock) -> FakeDeployer:
    return FakeDeployer(clock)


@pytest.fixture
def controller(deployer: FakeDeployer, clock: FakeClock) -> Controller:
    return Controller(deployer, clock, queue_timeout_s=900, max_queued=100, aging_s=120)


def acquiring(controller: Controller, id: int, **kw: Any) -> asyncio.Task[Slot]:
    return asyncio.ensure_future(controller.acquire(id, **kw))


async def gone(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_it_swaps_out_an_unused_model_without_waiting_for_its_idle_timeout(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "chat", 8, state="ready", idle_timeout_s=600)
    controller.release(await controller.acquire(1))
    await clock.advance(30)  # used 30 s ago: far from idle, but nothing in flight
    deployer.add(2, "coder", 8)
    waiter = acquiring(controller, 2)
    await settle()
    assert deployer.stops == [("chat", "Put to sleep to make room for coder")]
    deployer.finish(2)
    controller.release(await waiter)


async def test_it_keeps_the_model_that_costs_most_to_bring_back(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "slow-and-busy", 4, state="ready", start_s=90.0)
    deployer.add(2, "quick-and-rare", 4, state="ready", start_s=5.0)
    for _ in range(20):  # the slow one served twenty times
        controller.release(await controller.acquire(1))
    await clock.advance(5)
    controller.release(await controller.acquire(2))  # the quick one once, most recently
    await clock.advance(30)  # least recently used: the slow one; cheapest to stop: the other
    deployer.add(3, "new", 4)
    waiter = acquiring(controller, 3)
    await settle()
    assert deployer.stops == [("quick-and-rare", "Put to sleep to make room for new")]
    deployer.finish(3)
    controller.release(await waiter)


async def test_it_never_stops_a_model_of_a_higher_class_for_a_lower_request(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "vip", 8, state="ready", priority=HIGH)
    controller.release(await controller.acquire(1))
    await clock.advance(700)  # idle past its timeout even
    deployer.add(2, "batch", 8)
    queued: list[int] = []
    low = acquiring(controller, 2, priority=LOW, on_queued=lambda: queued.append(1))
    await settle()
    assert deployer.stops == [] and queued == [1]
    # A request of its class (or above) may: the key's class counts.
    high = acquiring(controller, 2, priority=HIGH)
    await settle()
    assert deployer.stops == [("vip", "Put to sleep to make room for batch")]
    deployer.finish(2)
    controller.release(await high)
    controller.release(await low)


async def test_it_serves_the_higher_class_first_from_the_queue(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "busy", 8, state="ready")
    busy = await controller.acquire(1)  # in flight: nothing can be stopped
    deployer.add(2, "low-model", 6)
    deployer.add(3, "high-model", 6)
    low = acquiring(controller, 2, priority=LOW)
    await settle()
    high = acquiring(controller, 3, priority=HIGH)
    await settle()
    assert list(controller.queue) == [2, 3] and controller.head() == 3  # arrival != turn
    controller.release(busy)
    await clock.advance(15)  # both look again: the high one makes room and starts
    assert deployer.starts == ["high-model"]
    assert [name for name, _ in deployer.stops] == ["busy"]
    deployer.finish(3)
    slot = await high
    assert not low.done()  # the room is the high one's; the low one still waits
    controller.release(slot)
    await gone(low)


async def test_it_ages_a_low_request_past_fresh_high_ones(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "busy", 8, state="ready")
    busy = await controller.acquire(1)
    deployer.add(2, "low-model", 6)
    deployer.add(3, "high-model", 6)
    low = acquiring(controller, 2, priority=LOW)
    await settle()
    await clock.advance(241)  # past twice the aging period: it ranks above a fresh high one
    high = acquiring(controller, 3, priority=HIGH)
    await settle()
    assert controller.head() == 2
    controller.release(busy)
    await clock.advance(15)
    assert deployer.starts == ["low-model"]
    deployer.finish(2)
    controller.release(await low)
    await gone(high)


async def test_it_stops_one_to_stay_under_the_loaded_model_cap(
    deployer: FakeDeployer, clock: FakeClock
) -> None:
    controller = Controller(deployer, clock, max_loaded=2)
    deployer.add(1, "a", 1, state="ready")
    deployer.add(2, "b", 1, state="ready")
    await clock.advance(1)
    controller.release(await controller.acquire(1))  # b is the least recently used
    await clock.advance(30)
    deployer.add(3, "c", 1)  # 2 GiB held of 10: memory is no reason to stop anything
    waiter = acquiring(controller, 3)
    await settle()
    assert deployer.stops == [("b", "Put to sleep to make room for c")]
    deployer.finish(3)
    controller.release(await waiter)


async def test_it_queues_at_the_cap_when_every_loaded_model_is_in_use(
    deployer: FakeDeployer, clock: FakeClock
) -> None:
    controller = Controller(deployer, clock, max_loaded=1)
    deployer.add(1, "a", 1, state="ready")
    busy = await controller.acquire(1)
    deployer.add(2, "b", 1)
    queued: list[int] = []
    waiter = acquiring(controller, 2, on_queued=lambda: queued.append(1))
    await settle()
    assert queued == [1] and deployer.starts == []
    controller.release(busy)
    await clock.advance(15)
    assert deployer.stops == [("a", "Put to sleep to make room for b")]
    deployer.finish(2)
    controller.release(await waiter)


async def test_it_drains_a_model_in_use_once_the_head_waited_the_collation_bound(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "busy", 8, state="ready")
    first = await controller.acquire(1)
    deployer.add(2, "other", 6)
    other = acquiring(controller, 2)
    await settle()
    await clock.advance(30)
    second = await controller.acquire(1)  # within the bound the loaded model takes requests
    controller.release(first)
    await clock.advance(31)  # the head has waited past 60 s: the model in its way is drained
    assert controller.draining == {1: 2}
    late = acquiring(controller, 1)
    await settle()
    assert not late.done()  # no new request on a drained model
    controller.release(second)  # its last one ends: unused, though a request waits for it
    await clock.advance(15)
    assert deployer.stops == [("busy", "Put to sleep to make room for other")]
    deployer.finish(2)
    controller.release(await other)
    assert controller.draining == {}  # the head started: nothing is held back for it now
    await gone(late)


async def test_it_never_drains_before_the_bound_or_with_collation_off(
    deployer: FakeDeployer, clock: FakeClock
) -> None:
    controller = Controller(deployer, clock, collation_s=0)
    deployer.add(1, "busy", 8, state="ready")
    held = await controller.acquire(1)
    deployer.add(2, "other", 6)
    other = acquiring(controller, 2)
    await clock.advance(600)
    assert controller.draining == {} and deployer.stops == []
    assert (await controller.acquire(1)) is not None  # still taking requests
    controller.release(held)
    await gone(other)


async def test_it_starts_once_more_after_an_out_of_memory_start_and_not_twice(
    controller: Controller, deployer: FakeDeployer, clock: FakeClock
) -> None:
    deployer.add(1, "big", 4)
    waiter = acquiring(controller, 1)
    await settle()

    def ran_out_of_memory(need: float) -> None:
        deployer.finish(1, "failed")
        deployer.rows[1] = replace(deployer.rows[1], out_of_memory=True, need_gib=need)

    ran_out_of_memory(6)  # it now claims what it showed it needs, and starts once more
    await settle()
    assert deployer.starts == ["big", "big"]
    deployer.finish(1)
    controller.release(await waiter)
    deployer.set_state(1, "stopped")
    again = acquiring(controller, 1)
    await settle()
    ran_out_of_memory(7)
    await settle()
    ran_out_of_memory(8)  # out of memory twice in one attempt: failed, with the cause
    with pytest.raises(GatewayError) as failed:
        await again
    assert (failed.value.status, failed.value.code) == (503, "start_failed")
    assert "ran out of memory as it started" in failed.value.message
    assert deployer.starts == ["big"] * 4
