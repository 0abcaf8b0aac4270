"""GPU memory as the driver reports it, through NVML (nvidia-ml-py).

Totals and use are read at every call: use is what lets the fit check see a stopped engine's
memory only once the driver has really released it. Without a driver (a CPU host) there are
no readings and the configured capacity stands.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    total_gib: float
    # What the driver reports in use; None for a device only declared (MSHIP_GPU_INVENTORY).
    used_gib: float | None
    uuid: str = ""


@functools.cache
def library() -> Any | None:
    """pynvml, initialised once; None where it or the driver is missing."""
    try:
        import pynvml  # noqa: PLC0415 - a failed import means a CPU host (caught below)

        pynvml.nvmlInit()
    except Exception:  # no package, no driver, no device: a CPU host
        return None
    return pynvml


def readings() -> list[GpuReading]:
    nvml = library()
    if nvml is None:
        return []
    try:
        found = []
        for index in range(nvml.nvmlDeviceGetCount()):
            device = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(device)
            found.append(
                GpuReading(
                    index=index,
                    name=text(nvml.nvmlDeviceGetName(device)),
                    total_gib=memory.total / 2**30,
                    used_gib=memory.used / 2**30,
                    uuid=text(nvml.nvmlDeviceGetUUID(device)),
                )
            )
        return found
    except Exception as exc:
        log.warning("NVML is present but could not be read: %s", exc)
        return []


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
