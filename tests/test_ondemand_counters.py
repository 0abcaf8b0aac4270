"""Live on-demand counters on the channel layer: at most one message a second per
deployment, the first at once, later changes folded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from ondemand.counters import GROUP, CounterPublisher
from tests.fake_clock import FakeClock, settle

pytestmark = [pytest.mark.redis]


async def test_it_publishes_the_first_change_at_once_and_folds_the_rest() -> None:
    layer = InMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    counts = {"inflight": 0}

    async def publish(deployment_id: int) -> None:
        await layer.group_send(
            GROUP, {"type": "deployment.ondemand", "id": deployment_id, "ondemand": dict(counts)}
        )

    clock = FakeClock()
    publisher = CounterPublisher(publish, clock)
    counts["inflight"] = 1
    publisher.changed(7)
    await settle()
    first = await layer.receive(channel)
    assert (first["id"], first["ondemand"]) == (7, {"inflight": 1})
    for n in (2, 3, 4):  # three changes within the second: one message, with the last counts
        counts["inflight"] = n
        publisher.changed(7)
    await clock.advance(0.5)
    assert publisher.pending  # nothing sent yet
    await clock.advance(0.5)
    folded: dict[str, Any] = await layer.receive(channel)
    assert folded["ondemand"] == {"inflight": 4}
    assert not publisher.pending
    await clock.advance(5)
    counts["inflight"] = 0
    publisher.changed(7)  # a second after the last: at once again
    await settle()
    assert (await layer.receive(channel))["ondemand"] == {"inflight": 0}


async def test_it_schedules_the_next_message_while_a_slow_publish_is_under_way() -> None:
    """A change during a publish (a slow channel layer) gets its own message a second later;
    the publish finishing does not forget it."""
    sent: list[int] = []
    release = asyncio.Event()

    async def publish(deployment_id: int) -> None:
        sent.append(deployment_id)
        if len(sent) == 1:
            await release.wait()

    clock = FakeClock()
    publisher = CounterPublisher(publish, clock)
    publisher.changed(3)
    await settle()
    assert sent == [3]  # the first publish is under way and slow
    publisher.changed(3)  # a change meanwhile: the next message is scheduled
    following = publisher.pending[3]
    release.set()
    await settle()
    assert publisher.pending.get(3) is following  # not forgotten by the first's end
    await clock.advance(1.0)
    await settle()
    assert sent == [3, 3] and not publisher.pending
    assert following.done() and following.exception() is None
