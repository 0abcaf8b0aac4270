"""What a started engine holds, measured, and what an out-of-memory start taught, kept only
while it is still true.

A start that ran out of memory raises the claim of the next (deployments/out_of_memory.py:
`learned_gib`, on the GPU model it was learned on). Left alone, that only ever grows: an OOM
caused by another process on the GPU would inflate the claim for good. So after each start
that became ready, the engine's footprint is measured (NVML's figure for its processes on a
GPU host, the resident memory of its process tree on a host without one) and the learned
claim goes halfway toward the larger of the declaration and the footprint with a margin; it
is forgotten once it is within DONE_GIB of the declaration. An engine that takes what it is
given (vLLM sizes its cache to its claim) measures its claim, and keeps it.

Measured for engines run as processes on this host (a container's or a Ray node's
processes are not ours to read).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from deployments import nvml
from deployments.learned import learned_here

if TYPE_CHECKING:
    from collections.abc import Iterable

    from deployments.models import Deployment

log = logging.getLogger(__name__)
MARGIN: Final = 1.1  # what a measured footprint is claimed with (allocations vary by start)
DONE_GIB: Final = 0.05  # a learned claim this close to the declaration is forgotten
MAX_PIDS: Final = 4096  # an engine's process tree, walked at most this far
NOT_AVAILABLE: Final = 1 << 63


def tree(pid: int) -> list[int]:
    """The process and its descendants (an engine that forks: vLLM's workers, a launcher)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < MAX_PIDS:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def resident_gib(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            # statm's second field: resident pages.
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096
    return total / 2**30


def gpu_gib(pids: Iterable[int]) -> float | None:
    """What NVML says these processes hold on every GPU; None where it cannot say."""
    library = nvml.library()
    if library is None:
        return None
    wanted, total, matched = set(pids), 0, False
    try:
        for index in range(library.nvmlDeviceGetCount()):
            device = library.nvmlDeviceGetHandleByIndex(index)
            for process in library.nvmlDeviceGetComputeRunningProcesses(device):
                used = getattr(process, "usedGpuMemory", None)
                # NVML's "not available" is the largest 64-bit value.
                if process.pid in wanted and isinstance(used, int) and used < NOT_AVAILABLE:
                    total, matched = total + used, True
    except Exception as exc:
        log.warning("NVML could not say what the engine holds: %s", exc)
        return None
    # None of its processes seen (a container's, by other PIDs; a driver that does not say):
    # not known, rather than nothing held (which would make a learned claim decay).
    return total / 2**30 if matched else None


def measured_gib(handles: list[dict[str, Any]]) -> float | None:
    """The most any replica holds (GiB), where each runs as a process of this host; None
    where it cannot be said. Never raises: a figure not measured is a figure not known."""
    try:
        return most_held(handles)
    except Exception:
        log.exception("an engine's footprint was not measured")
        return None


def most_held(handles: list[dict[str, Any]]) -> float | None:
    most = None
    on_gpus = bool(nvml.readings())
    for handle in handles:
        pid = handle.get("pid")
        if type(pid) is not int or pid <= 0:
            return None
        pids = tree(pid)
        held = gpu_gib(pids) if on_gpus else resident_gib(pids)
        if held is None:
            return None
        most = held if most is None else max(most, held)
    return None if most is None else round(most, 3)


def after_start(deployment: Deployment, handles: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields a start that became ready updates: its measured footprint, and its learned
    claim gone halfway toward what the footprint shows (forgotten once it meets the
    declaration). Never raises: a footprint not measured changes nothing learned."""
    measured = measured_gib(handles)
    fields: dict[str, Any] = {"measured_gib": measured}
    learned = learned_here(deployment)
    if not learned:
        return fields
    now = settled(learned, declared_gib(deployment), measured)
    if now is None:
        fields.update(learned_gib=None, learned_on="")
    elif now != learned:
        fields["learned_gib"] = now
    return fields


def declared_gib(deployment: Deployment) -> float:
    """What it claims without a lesson: its memory_gib, else what its loader gives it."""
    if deployment.memory_gib is not None:
        return float(deployment.memory_gib)
    from deployments.memory import estimate_gib  # noqa: PLC0415 - memory reads this module

    return estimate_gib(deployment)


def settled(learned: float, declared: float, measured: float | None) -> float | None:
    """A learned claim after a start that measured this footprint: halfway toward the larger
    of the declaration and the footprint with its margin (never up: an out-of-memory start
    raises it, not a measurement); None once it is within DONE_GIB of the declaration."""
    if measured is None:
        return learned
    target = max(declared, measured * MARGIN)
    if target >= learned:
        return learned
    now = round(learned - (learned - target) / 2, 3)
    return None if now - declared <= DONE_GIB else now
