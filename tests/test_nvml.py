"""GPU memory from NVML, with a fake pynvml module standing in for a driver this machine
does not have (the real library raises at nvmlInit here)."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

import pytest

from deployments import deployer, nvml
from deployments.memory import InsufficientMemory, capacity_gib, check_fit, host_summary, need_gib

if TYPE_CHECKING:
    from collections.abc import Iterator

GIB = 2**30


class FakeDriver:
    def __init__(self, totals: list[float]) -> None:
        self.totals = totals
        self.used = [0.0] * len(totals)

    def module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        module.nvmlInit = lambda: None  # type: ignore[attr-defined]
        module.nvmlDeviceGetCount = lambda: len(self.totals)  # type: ignore[attr-defined]
        module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
        module.nvmlDeviceGetName = lambda i: b"NVIDIA H200"  # type: ignore[attr-defined]

        def memory(i: int) -> Any:
            total, used = self.totals[i] * GIB, self.used[i] * GIB
            return types.SimpleNamespace(total=total, used=used, free=total - used)

        module.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
        return module


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, site: Any) -> Iterator[FakeDriver]:
    fake = FakeDriver([80.0, 80.0])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    site.MSHIP_MEMORY_CAPACITY_GIB = None
    site.MSHIP_GPU_MEMORY_GIB = None
    nvml.library.cache_clear()
    yield fake
    nvml.library.cache_clear()


def test_it_takes_capacity_and_gpu_size_from_nvml(driver: FakeDriver, make_deployment: Any) -> None:
    assert capacity_gib() == 160.0
    assert need_gib(make_deployment(memory_gib=None, num_gpus=0.5)) == 40.0
    summary = host_summary()
    assert summary["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "total_gib": 80.0, "used_gib": 0.0},
        {"index": 1, "name": "NVIDIA H200", "total_gib": 80.0, "used_gib": 0.0},
    ]


@pytest.mark.usefixtures("engines")
def test_it_sees_freed_memory_only_once_the_driver_releases_it(
    driver: FakeDriver, make_deployment: Any
) -> None:
    first = make_deployment("first", memory_gib=120)
    deployer.restart(first.pk)
    driver.used = [80.0, 40.0]  # the engine really holds it
    deployer.stop(first.pk)
    # Stopped, but the driver has not released the memory yet.
    second = make_deployment("second", memory_gib=100)
    with pytest.raises(InsufficientMemory) as refused:
        check_fit(second)
    assert refused.value.free_gib == 40.0
    assert host_summary()["free_gib"] == 40.0
    driver.used = [0.5, 0.5]  # released
    check_fit(second)


def test_it_falls_back_to_the_setting_without_a_driver(
    monkeypatch: pytest.MonkeyPatch, site: Any
) -> None:
    broken = types.ModuleType("pynvml")

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    nvml.library.cache_clear()
    site.MSHIP_MEMORY_CAPACITY_GIB = None
    site.MSHIP_DEFAULT_CAPACITY_GIB = 12.0
    try:
        assert nvml.readings() == []
        assert capacity_gib() == 12.0
    finally:
        nvml.library.cache_clear()


def test_it_lets_an_explicit_capacity_win(driver: FakeDriver, site: Any) -> None:
    site.MSHIP_MEMORY_CAPACITY_GIB = 100.0
    assert capacity_gib() == 100.0
