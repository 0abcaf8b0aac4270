"""What a sleeping engine still holds (a vLLM asleep keeps its CUDA context and buffers on
the GPU): measured as it falls asleep, counted by the budget, and given back by make-room,
which stops a sleeper before it touches a loaded model (deployments/memory.py,
ondemand/make_room.py), end to end through /v1 with the simulated engine, which sleeps and
holds the memory it is told to allocate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.utils import timezone

from deployments import deployer
from deployments.api.serializers import DeploymentSerializer
from deployments.memory import host_summary
from deployments.models import Deployment, State
from deployments.placement import Demand, Device
from modelship_cli.render import description
from ondemand.state import Budget, View
from tests.conftest import sim
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")


def test_it_counts_what_a_sleeper_keeps_and_stops_it_to_make_room(
    make_deployment: Any, api_key: Callable[..., str], gateway_url: str, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    site.MSHIP_MEMORY_CAPACITY_GIB = 1.0
    # It keeps 0.3 GiB allocated whether awake or asleep (as a CUDA context stays).
    napper = make_deployment(
        "napper",
        mode="on_demand",
        idle_timeout_s=600,
        memory_gib=0.5,
        config=sim(enable_sleep_mode=True, allocate_mib=300),
    )
    deployer.restart(napper.pk)
    assert deployer.sleep(napper.pk, reason="a test's sleep")
    napper.refresh_from_db()
    assert napper.state == State.ASLEEP and napper.asleep_gib is not None
    assert 0.3 <= napper.asleep_gib < 0.5  # its process, measured
    shown = DeploymentSerializer(napper).data  # the API, and `modelship describe`
    assert shown["asleep_gib"] == napper.asleep_gib
    lines = description(dict(shown), [])
    assert any(
        line.startswith("Memory kept asleep (GiB):") and line.endswith(f" {napper.asleep_gib}")
        for line in lines
    )
    summary = host_summary()
    assert summary["held_gib"] == pytest.approx(napper.asleep_gib, abs=1e-3)
    assert summary["free_gib"] == pytest.approx(1.0 - napper.asleep_gib, abs=1e-3)
    # Its lease (the start's) lapsed: nobody uses it.
    Deployment.objects.filter(pk=napper.pk).update(lease_until=timezone.now())

    # 0.8 GiB does not fit beside what the sleeper keeps: make-room stops it, and only it.
    make_deployment("big", mode="on_demand", idle_timeout_s=600, memory_gib=0.8, config=sim())
    seen_by_gateway(lambda s: "big" in s.routes)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0, timeout=60)
    answer = sdk.chat.completions.create(model="big", messages=[{"role": "user", "content": "x"}])
    assert answer.choices[0].message.content
    napper.refresh_from_db()
    assert (napper.state, napper.state_reason) == (
        State.STOPPED,
        "Stopped (asleep) to make room for big",
    )
    assert napper.asleep_gib is None and napper.sleep_level is None
    assert Deployment.objects.get(name="big").state == State.READY


def test_it_counts_what_a_waking_sleeper_kept_as_its_own_and_no_sleeper_as_loaded() -> None:
    # 1 GiB in all: a sleeper needing 0.8 kept 0.3 asleep; an idle model holds 0.3.
    sleeper = View(3, "napper", State.ASLEEP, True, 0.8, 600, holds_gib=0.3, wakes_on=(0,))
    idle = View(4, "idle", State.READY, True, 0.3, 600, held=((0, 0.3),))
    pool = Budget(capacity_gib=1.0, free_gib=0.4)
    assert not pool.room_after(sleeper)  # 0.4 free and its own 0.3: 0.7 of 0.8
    assert pool.room_after(sleeper, [idle])  # what it kept is its own again as it wakes
    # On a GPU with a cap of one engine each: a sleeper stopped frees memory, not a place.
    gpu = Budget(
        capacity_gib=1.0,
        free_gib=0.4,
        devices=(Device(0, 1.0, 0.4),),
        engines_on=((0, 1),),
        gpu_cap=1,
    )
    other = View(5, "other", State.STOPPED, True, 0.3, 600, demand=Demand(gib=0.3))
    kept = View(6, "kept", State.ASLEEP, True, 0.5, 600, holds_gib=0.3, held=((0, 0.3),))
    assert not gpu.room_after(other, [kept])  # the loaded engine still has GPU 0's place
    assert gpu.room_after(other, [idle])
