"""The placement policy (pack: the fullest device that fits), as a table."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from common.env import env_gpu_inventory
from deployments.placement import Demand, Device, NoRoom, fits_where, never_fits, place


def host(*free: float, total: float = 80.0) -> list[Device]:
    return [Device(index, total, gib) for index, gib in enumerate(free)]


PLACES = [
    # (what is free on each 80 GiB device, the demand, each replica's devices)
    ((80, 80), Demand(share=0.9), [[0]]),
    ((8, 80), Demand(share=0.9), [[1]]),  # device 0 has no room for 72 GiB
    ((30, 50, 80), Demand(gib=20), [[0]]),  # pack: the fullest that fits
    ((10, 50, 80), Demand(gib=20), [[1]]),
    ((50, 50), Demand(gib=20), [[0]]),  # equals: the lowest index
    ((80, 80), Demand(gib=30, replicas=2), [[0], [0]]),  # both fit on one device
    ((80, 80), Demand(share=0.9, replicas=2), [[0], [1]]),  # 72 GiB each: two devices
    ((80, 40, 80, 80), Demand(devices=2, share=1.0), [[0, 2]]),  # whole devices only
    ((80, 80, 80, 80), Demand(devices=4, share=1.0), [[0, 1, 2, 3]]),
    ((80, 80, 80, 80), Demand(devices=2, share=1.0, replicas=2), [[0, 1], [2, 3]]),
]


@pytest.mark.parametrize(("free", "demand", "placed"), PLACES)
def test_it_packs_each_replica_onto_the_fullest_devices_that_fit(
    free: tuple[float, ...], demand: Demand, placed: list[list[int]]
) -> None:
    assert place(demand, host(*free)) == placed


REFUSED = [
    ((8, 8), Demand(share=0.9), [64.0, 64.0]),
    ((80, 40, 80), Demand(devices=3, share=1.0), [0.0, 40.0, 0.0]),
    ((80, 50), Demand(share=0.9, replicas=2), [0.0, 22.0]),  # the second replica has none
]


@pytest.mark.parametrize(("free", "demand", "shorts"), REFUSED)
def test_it_refuses_with_each_devices_shortfall(
    free: tuple[float, ...], demand: Demand, shorts: list[float]
) -> None:
    with pytest.raises(NoRoom) as refused:
        place(demand, host(*free))
    assert [round(row.short_gib, 3) for row in refused.value.devices] == shorts
    assert str(refused.value).startswith("no ")


def test_it_says_why_a_demand_can_never_fit() -> None:
    empty = host(80, 80)
    assert never_fits(Demand(devices=3, share=1.0), empty) == "needs 3 GPUs, this host has 2"
    assert never_fits(Demand(gib=100), empty) == (
        "needs 100 GiB on one GPU, the largest here has 80 GiB"
    )
    assert never_fits(Demand(devices=2, share=1.0, replicas=2), empty) == (
        "needs 2 replicas of 2 GPUs each, more than this host's 2 GPUs hold"
    )
    assert never_fits(Demand(share=0.9, replicas=2), empty) is None


def test_it_wakes_only_where_it_ran() -> None:
    fits_where(Demand(gib=40), host(80, 10), [[0]])
    with pytest.raises(NoRoom):
        fits_where(Demand(gib=40), host(10, 80), [[0]])  # GPU 1's room is no use to it


def test_it_reads_a_declared_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, devices in [
        ("80,80,80,80", [(0, 80.0), (1, 80.0), (2, 80.0), (3, 80.0)]),
        ("0:80, 1:40.5", [(0, 80.0), (1, 40.5)]),
        ("2:24,0:80", [(0, 80.0), (2, 24.0)]),
        ("", []),
    ]:
        monkeypatch.setenv("MSHIP_GPU_INVENTORY", text)
        assert env_gpu_inventory("MSHIP_GPU_INVENTORY") == devices
    for bad in ("80,,80", "eighty", "0:80,0:80", "-1:80", "0:0", "80,nan"):
        monkeypatch.setenv("MSHIP_GPU_INVENTORY", bad)
        with pytest.raises(ImproperlyConfigured, match="MSHIP_GPU_INVENTORY"):
            env_gpu_inventory("MSHIP_GPU_INVENTORY")
