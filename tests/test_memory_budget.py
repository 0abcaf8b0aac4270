"""The fit check holds every start to the memory budget."""

from __future__ import annotations

from typing import Any

import pytest

from deployments import deployer
from deployments.memory import (
    InsufficientMemory,
    check_fit,
    host_summary,
    need_gib,
    short_of_room,
)
from deployments.models import Deployment, DeploymentEvent, State

pytestmark = pytest.mark.usefixtures("engines")


def test_it_refuses_what_does_not_fit_and_accepts_it_once_memory_is_freed(
    make_deployment: Any,
) -> None:
    big = make_deployment("big", memory_gib=6)
    other = make_deployment("other", memory_gib=3)
    deployer.restart(big.pk)

    with pytest.raises(InsufficientMemory) as refused:
        deployer.restart(other.pk)
    assert refused.value.shortfall_gib == 1.0
    assert refused.value.free_gib == 2.0
    other.refresh_from_db()
    assert other.state == State.PLANNED  # a refused start leaves it as it was
    refusal = DeploymentEvent.objects.get(deployment=other, kind="start_refused")
    assert "short by 1.0 GiB" in refusal.text

    deployer.stop(big.pk)
    deployer.restart(other.pk)
    other.refresh_from_db()
    assert other.state == State.READY


def test_it_counts_replicas_and_gpu_fractions(make_deployment: Any, site: Any) -> None:
    site.MSHIP_GPU_MEMORY_GIB = 80.0
    assert need_gib(make_deployment("a", memory_gib=1.5, num_replicas=2)) == 3.0
    assert need_gib(make_deployment("b", memory_gib=None, num_gpus=0.25)) == 20.0
    claim = make_deployment("c", memory_gib=None, config={"memory_claim_gib": 0.75})
    assert need_gib(claim) == 0.75


def test_it_estimates_a_model_file_without_a_header_by_its_size(
    make_deployment: Any, tmp_path: Any
) -> None:
    """No GGUF header to read layers and heads from: the weights and llama.cpp's overhead
    (0.05 GiB and a tenth of the weights), no cache (tests/test_memory_estimate.py reads
    real headers)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"\0" * (2**30 // 8))
    deployment = make_deployment(
        "g", loader="llama_server", model=str(gguf), memory_gib=None, config={"n_ctx": 1024}
    )
    assert need_gib(deployment) == pytest.approx(0.125 + 0.05 + 0.0125, abs=1e-3)


def test_it_lets_a_sleeping_engine_free_its_memory(make_deployment: Any) -> None:
    first = make_deployment("first", memory_gib=5, config={"enable_sleep_mode": True})
    second = make_deployment("second", memory_gib=5)
    deployer.restart(first.pk)
    deployer.sleep(first.pk)
    deployer.restart(second.pk)
    second.refresh_from_db()
    assert second.state == State.READY
    # Waking the first would need memory the second now holds.
    with pytest.raises(InsufficientMemory):
        deployer.wake(first.pk)
    first.refresh_from_db()
    assert first.state == State.ASLEEP


def test_it_reports_the_host_budget(make_deployment: Any) -> None:
    pinned = make_deployment("pinned", memory_gib=2, mode="always_on")
    lazy = make_deployment("lazy", memory_gib=1, mode="on_demand")
    deployer.restart(pinned.pk)
    deployer.restart(lazy.pk)
    summary = host_summary()
    assert summary["capacity_gib"] == 8.0
    assert summary["held_gib"] == 3.0
    assert summary["free_gib"] == 5.0
    assert summary["on_demand_capacity_gib"] == 6.0
    assert {d["name"]: d["holding_gib"] for d in summary["deployments"]} == {
        "pinned": 2.0,
        "lazy": 1.0,
    }
    check_fit(make_deployment("fits", memory_gib=5))


def test_it_tells_make_room_whether_the_room_is_still_short(make_deployment: Any) -> None:
    """The check before each make-room stop, on fresh rows: a stop under way counts as
    room made, and a start made meanwhile (by another process) needs none."""
    leaving = make_deployment("leaving", memory_gib=4.0, state=State.READY)
    make_deployment("staying", memory_gib=4.0, state=State.READY)
    waiting = make_deployment("waiting", memory_gib=4.0, state=State.STOPPED)
    assert short_of_room(waiting.pk)  # 8 GiB held of 8
    Deployment.objects.filter(pk=leaving.pk).update(state=State.STOPPING)
    assert not short_of_room(waiting.pk)
    Deployment.objects.filter(pk=leaving.pk).update(state=State.READY)
    Deployment.objects.filter(pk=waiting.pk).update(state=State.STARTING)
    assert not short_of_room(waiting.pk)
