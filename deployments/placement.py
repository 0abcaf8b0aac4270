"""Which GPUs a start goes to: one pure function of what it asks and what each device has free.

The policy is Ray's default, pack: each replica goes to the fullest devices that still fit it
(the least memory left over after it), lowest index first among equals. Packing keeps whole
devices free for the tensor-parallel and whole-GPU starts that need them; spreading would leave
every device part-used and refuse them. A tensor-parallel replica (num_gpus 2, 4, …) takes that
many devices, whole.

No database, no NVML: memory.py reads those and calls this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

EPSILON_GIB = 1e-9  # memory sums compare with this slack


@dataclass(frozen=True)
class Device:
    index: int
    total_gib: float
    free_gib: float


@dataclass(frozen=True)
class Demand:
    """What one deployment asks of the devices: per replica, `devices` of them, each holding
    `gib` (memory_gib, an estimate) or `share` of its size (num_gpus)."""

    replicas: int = 1
    devices: int = 1
    gib: float | None = None
    share: float = 0.0

    def on(self, device: Device) -> float:
        """What one replica holds on one of its devices."""
        return self.gib if self.gib is not None else self.share * device.total_gib


@dataclass(frozen=True)
class Shortfall:
    """One device's view of a refused placement."""

    index: int
    need_gib: float
    free_gib: float

    @property
    def short_gib(self) -> float:
        return max(0.0, self.need_gib - self.free_gib)


class NoRoom(Exception):
    """Not enough devices have room now; `devices` says how short each one is."""

    def __init__(self, demand: Demand, devices: Sequence[Device]) -> None:
        self.demand = demand
        self.devices = [Shortfall(d.index, demand.on(d), d.free_gib) for d in devices]
        super().__init__(describe(demand, self.devices))


def describe(demand: Demand, rows: Sequence[Shortfall]) -> str:
    each = "; ".join(
        f"GPU {r.index} has {r.free_gib:.3g} GiB free"
        + (f" (short by {r.short_gib:.3g})" if r.short_gib > EPSILON_GIB else "")
        for r in rows
    )
    if demand.replicas > 1:
        return f"no room for its {demand.replicas} replicas of {gpus(demand.devices)} now: {each}"
    return f"no {gpus(demand.devices)} with room for it now: {each}"


def gpus(count: int) -> str:
    return "GPU" if count == 1 else f"{count} GPUs"


def place(demand: Demand, devices: Sequence[Device]) -> list[list[int]]:
    """The devices of each replica, by the pack policy; NoRoom when a replica cannot go
    anywhere (placing nothing: a start is placed whole or not at all)."""
    free = {d.index: d.free_gib for d in devices}
    placed: list[list[int]] = []
    for _ in range(demand.replicas):
        now = [Device(d.index, d.total_gib, free[d.index]) for d in devices]
        fitting = [d for d in now if demand.on(d) <= d.free_gib + EPSILON_GIB]
        if len(fitting) < demand.devices:
            raise NoRoom(demand, devices)  # as they were before this start
        fitting.sort(key=lambda d: (d.free_gib - demand.on(d), d.index))
        chosen = fitting[: demand.devices]
        for device in chosen:
            free[device.index] -= demand.on(device)
        placed.append(sorted(d.index for d in chosen))
    return placed


def fits(demand: Demand, devices: Sequence[Device]) -> bool:
    try:
        place(demand, devices)
    except NoRoom:
        return False
    return True


def fits_where(demand: Demand, devices: Sequence[Device], placed: list[list[int]]) -> None:
    """A start on devices already chosen (a sleeping engine waking where it runs): NoRoom
    unless each of them has room for its replicas."""
    by_index = {d.index: d for d in devices}
    need: dict[int, float] = {}
    for replica in placed:
        for index in replica:
            if index in by_index:
                need[index] = need.get(index, 0.0) + demand.on(by_index[index])
    short = [i for i, gib in need.items() if gib > by_index[i].free_gib + EPSILON_GIB]
    if short:
        raise NoRoom(demand, [by_index[i] for i in sorted(need)])


def never_fits(demand: Demand, devices: Sequence[Device]) -> str | None:
    """Why the demand cannot be placed even on an empty host; None when it can."""
    if demand.devices > len(devices):
        return f"needs {demand.devices} GPUs, this host has {len(devices)}"
    largest = max(devices, key=lambda d: d.total_gib)
    if demand.on(largest) > largest.total_gib + EPSILON_GIB:
        return (
            f"needs {demand.on(largest):.3g} GiB on one GPU, the largest here has"
            f" {largest.total_gib:.3g} GiB"
        )
    empty = [Device(d.index, d.total_gib, d.total_gib) for d in devices]
    if not fits(demand, empty):
        return (
            f"needs {demand.replicas} replicas of {gpus(demand.devices)} each, more than this"
            f" host's {len(devices)} GPUs hold"
        )
    return None


def freed(devices: Sequence[Device], holdings: Iterable[tuple[int, float]]) -> list[Device]:
    """The devices as they would be with these holdings (device, GiB) released."""
    extra: dict[int, float] = {}
    for index, gib in holdings:
        extra[index] = extra.get(index, 0.0) + gib
    return [Device(d.index, d.total_gib, d.free_gib + extra.get(d.index, 0.0)) for d in devices]
