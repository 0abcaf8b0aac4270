"""GPU memory from NVML, with a fake pynvml module standing in for a driver this machine
does not have (the real library raises at nvmlInit here)."""

from __future__ import annotations

import os
import sys
import types
from io import StringIO
from typing import TYPE_CHECKING, Any

import pytest
from django.core.management import CommandError, call_command

from deployments import deployer, nvml
from deployments.memory import InsufficientMemory, capacity_gib, check_fit, host_summary, need_gib

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

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
        module.nvmlDeviceGetUUID = lambda i: f"GPU-{i:08d}"  # type: ignore[attr-defined]

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
    assert [
        (g["index"], g["uuid"], g["name"], g["total_gib"], g["used_gib"], g["free_gib"])
        for g in summary["gpus"]
    ] == [
        (0, "GPU-00000000", "NVIDIA H200", 80.0, 0.0, 80.0),
        (1, "GPU-00000001", "NVIDIA H200", 80.0, 0.0, 80.0),
    ]
    assert summary["placement"] == "per GPU (pack)"


@pytest.mark.usefixtures("engines")
def test_it_sees_freed_memory_only_once_the_driver_releases_it(
    driver: FakeDriver, make_deployment: Any
) -> None:
    first = make_deployment("first", memory_gib=60)
    other = make_deployment("other", memory_gib=60)
    deployer.restart(first.pk)
    deployer.restart(other.pk)
    driver.used = [60.0, 60.0]  # the engines really hold it
    deployer.stop(first.pk)
    deployer.stop(other.pk)
    # Stopped, but the driver has not released the memory yet.
    second = make_deployment("second", memory_gib=70)
    with pytest.raises(InsufficientMemory) as refused:
        check_fit(second)
    assert refused.value.free_gib == 40.0
    assert [g["short_gib"] for g in refused.value.extra()["gpus"]] == [50.0, 50.0]
    assert host_summary()["free_gib"] == 40.0
    driver.used = [0.5, 60.0]  # released on the first device only
    assert check_fit(second) == [[0]]


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


def test_it_lets_an_explicit_capacity_make_one_pool(
    driver: FakeDriver, site: Any, make_deployment: Any
) -> None:
    site.MSHIP_MEMORY_CAPACITY_GIB = 100.0
    assert capacity_gib() == 100.0
    assert host_summary()["placement"] == "one pool"
    assert check_fit(make_deployment(memory_gib=90)) == []  # placed on no GPU


@pytest.mark.django_db  # the host summary reads the deployments
def test_it_compares_what_it_reads_with_nvidia_smi(
    driver: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    def reports(*rows: str) -> None:
        smi.write_text("#!/bin/sh\nprintf '" + "\\n".join(rows) + "\\n'\n")
        smi.chmod(0o755)

    reports("0, GPU-00000000, 81920", "1, GPU-00000001, 81920")
    out = StringIO()
    call_command("gpu_check", "--require-gpu", "--compare-nvidia-smi", stdout=out)
    assert "nvidia-smi: 2 GPU(s), 0 mismatch(es)" in out.getvalue()
    assert "NVIDIA H200" in out.getvalue()

    reports("0, GPU-00000000, 81920", "1, GPU-99999999, 40960")
    with pytest.raises(CommandError) as mismatch:
        call_command("gpu_check", "--compare-nvidia-smi", stdout=StringIO())
    assert "GPU 1: UUID GPU-00000001 here, GPU-99999999 in nvidia-smi" in str(mismatch.value)
    assert "GPU 1: 80.00 GiB here, 40.00 there" in str(mismatch.value)
