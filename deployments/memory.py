"""The memory budget: what the host can hold, what deployments hold, and the fit check.

A GPU host's budget is per device (gpu_inventory): a start is placed on devices
(placement.py) and fits only where it is placed. A host without GPUs, or one given
MSHIP_MEMORY_CAPACITY_GIB, is a single pool: one device of that size, which nothing is
assigned to.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from django.conf import settings

from deployments import nvml, placement
from deployments.learned import learned_here
from deployments.loaders import LOADERS, EngineSpec, get_loader
from deployments.models import (
    HOLDING_STATES,
    STARTABLE_STATES,
    Deployment,
    Mode,
    Runtime,
    State,
)
from deployments.placement import Demand, Device, NoRoom, Shortfall
from deployments.refusals import OperationRefused

if TYPE_CHECKING:
    from deployments.estimate import Estimate

log = logging.getLogger(__name__)

POOL = 0  # the one device of a host without GPUs


class InsufficientMemory(OperationRefused):
    code = "insufficient_memory"

    def __init__(
        self,
        name: str,
        need_gib: float,
        free_gib: float,
        capacity_gib: float,
        devices: list[Shortfall] | None = None,
        shortfall_gib: float | None = None,
        where: str = "",
    ) -> None:
        self.name = name
        self.need_gib = round(need_gib, 3)
        self.free_gib = round(free_gib, 3)
        self.capacity_gib = round(capacity_gib, 3)
        self.devices = devices or []
        short = need_gib - free_gib if shortfall_gib is None else shortfall_gib
        self.shortfall_gib = round(short, 3)
        if where:
            message = f"{name} needs {self.need_gib} GiB: {where}"
        else:
            message = (
                f"{name} needs {self.need_gib} GiB but {self.free_gib} GiB of "
                f"{self.capacity_gib} GiB is free (short by {self.shortfall_gib} GiB)"
            )
        super().__init__(message)

    def extra(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "shortfall_gib": self.shortfall_gib,
            "need_gib": self.need_gib,
            "free_gib": self.free_gib,
            "capacity_gib": self.capacity_gib,
        }
        if self.devices:
            found["gpus"] = [
                {
                    "index": row.index,
                    "need_gib": round(row.need_gib, 3),
                    "free_gib": round(row.free_gib, 3),
                    "short_gib": round(row.short_gib, 3),
                }
                for row in self.devices
            ]
        return found


def gpu_inventory() -> list[nvml.GpuReading]:
    """The GPUs the budget is kept per device for: declared, else NVML's; none for a pool."""
    declared = settings.MSHIP_GPU_INVENTORY
    if declared:
        return [
            nvml.GpuReading(index=index, name="declared", total_gib=gib, used_gib=None)
            for index, gib in declared
        ]
    if settings.MSHIP_MEMORY_CAPACITY_GIB:
        return []
    return nvml.readings()


def capacity_gib() -> float:
    """Usable accelerator memory of this host."""
    gpus = gpu_inventory()
    if gpus:
        return sum(gpu.total_gib for gpu in gpus)
    return float(settings.MSHIP_MEMORY_CAPACITY_GIB or settings.MSHIP_DEFAULT_CAPACITY_GIB)


def used_gib() -> float | None:
    """Accelerator memory in use now, as the driver reports it; None where none reports."""
    readings = [gpu.used_gib for gpu in gpu_inventory() if gpu.used_gib is not None]
    return sum(readings) if readings else None


def gpu_memory_gib() -> float:
    """The size of one GPU, which a deployment's num_gpus is a fraction of."""
    gpus = gpu_inventory()
    if gpus:
        return gpus[0].total_gib
    return float(settings.MSHIP_GPU_MEMORY_GIB or capacity_gib())


def estimate_gib(deployment: Any) -> float:
    return get_loader(deployment.loader).estimate_memory_gib(EngineSpec.of(deployment)) or 0.0


def estimate_of(deployment: Any) -> Estimate | None:
    """What its model's metadata says its engine will hold (deployments/estimate.py)."""
    loader = LOADERS.get(deployment.loader)
    return None if loader is None else loader.memory_estimate(EngineSpec.of(deployment))


def estimate_report(deployment: Any) -> dict[str, Any] | None:
    """The estimate, its parts and basis, and a warning where the operator declared less."""
    found = estimate_of(deployment)
    if found is None:
        return None
    report = found.as_dict()
    declared = deployment.memory_gib
    report["warning"] = (
        f"memory_gib {declared:g} is below the estimate of {found.gib:g} GiB: the engine may"
        " not fit what the budget gives it"
        if declared is not None and float(declared) < found.gib
        else None
    )
    given = given_gib(deployment)
    counted = get_loader(deployment.loader).sequences_fit(EngineSpec.of(deployment), given)
    report["sequences_fit"], report["sequences_wanted"] = counted or (None, None)
    if counted is not None and counted[0] < counted[1] and report["warning"] is None:
        report["warning"] = (
            f"{counted[0]} full-length sequences of KV cache fit in {given:g} GiB, fewer than"
            f" the {counted[1]} it should hold at once: past them the engine preempts (declare"
            " more memory_gib, or a shorter max_model_len)"
        )
    return report


def given_gib(deployment: Any) -> float:
    """The memory one replica's engine is given: its declaration (memory_gib, or its share of
    a GPU), else what its loader gives an undeclared one."""
    if deployment.memory_gib is not None:
        return float(deployment.memory_gib)
    if deployment.num_gpus:
        return float(deployment.num_gpus) * gpu_memory_gib()
    return estimate_gib(deployment)


def demand_of(deployment: Any, on_gpus: bool) -> Demand | None:
    """What a deployment asks of this host's devices; None: nothing (num_gpus 0, or no memory
    known, which on a GPU host runs it on no GPU; or on the ray runtime, whose engines Ray
    places on its own nodes by its own resources)."""
    if getattr(deployment, "runtime", None) == Runtime.RAY:
        return None
    # A row knows its running count (autoscaling); a shape being validated, its setting.
    replicas = max(
        1, int(getattr(deployment, "replica_count", None) or deployment.num_replicas or 1)
    )
    num_gpus = deployment.num_gpus
    learned = learned_here(deployment)
    if not on_gpus:
        if deployment.memory_gib is not None:
            gib = float(deployment.memory_gib)
        elif num_gpus is not None:
            gib = float(num_gpus) * gpu_memory_gib()
        else:
            gib = estimate_gib(deployment)
        return Demand(replicas=replicas, gib=max(gib, learned))
    if num_gpus is not None:
        if num_gpus <= 0:
            return None
        if num_gpus > 1:
            return Demand(replicas=replicas, devices=math.ceil(num_gpus), share=1.0)
        return Demand(replicas=replicas, share=float(num_gpus))
    gib = (
        float(deployment.memory_gib)
        if deployment.memory_gib is not None
        else estimate_gib(deployment)
    )
    gib = max(gib, learned)
    return Demand(replicas=replicas, gib=gib) if gib > 0 else None


def need_gib(deployment: Any) -> float:
    """Memory one deployment holds on this host while it runs, over all its replicas and
    devices."""
    gpus = gpu_inventory()
    demand = demand_of(deployment, bool(gpus))
    if demand is None:
        return 0.0
    size = Device(POOL, gpus[0].total_gib if gpus else capacity_gib(), 0.0)
    return demand.on(size) * demand.devices * demand.replicas


def held_by(row: Deployment, gpus: list[nvml.GpuReading]) -> list[tuple[int, float]]:
    """What a running deployment holds on each GPU it was placed on: (device, GiB) per
    replica and device; asleep, what each replica was measured holding as it fell asleep,
    shared among its devices."""
    sizes = {g.index: Device(g.index, g.total_gib, 0.0) for g in gpus}
    if kept_asleep(row):
        kept = float(row.asleep_gib or 0.0)
        return [
            (index, kept / len(replica))
            for replica in row.gpus or []
            for index in replica
            if index in sizes and kept
        ]
    demand = demand_of(row, True)
    if demand is None:
        return []
    return [
        (index, demand.on(sizes[index]))
        for replica in row.gpus or []
        for index in replica
        if index in sizes
    ]


# What holds memory on this host: a running engine, and one asleep (what it kept).
HELD_STATES = (*HOLDING_STATES, State.ASLEEP)


def holds_gib(row: Deployment) -> float:
    """What a deployment holds on this host now, over its replicas: what it needs while it
    runs, what it was measured keeping while asleep, nothing otherwise."""
    if kept_asleep(row):
        return float(row.asleep_gib or 0.0) * max(1, int(row.replica_count or 1))
    return need_gib(row) if row.state in HOLDING_STATES else 0.0


def kept_asleep(row: Deployment) -> bool:
    """Asleep, or being stopped from asleep (it holds what it kept until it is gone)."""
    if row.state == State.ASLEEP:
        return True
    return row.state == State.STOPPING and row.asleep_gib is not None


def holdings_by_device(
    exclude_id: int | None = None,
) -> tuple[list[nvml.GpuReading], dict[int, list[tuple[Deployment, float]]]]:
    """The inventory, and on each of its devices (the pool's: POOL) what each deployment
    holds there, by the records."""
    gpus = gpu_inventory()
    held: dict[int, list[tuple[Deployment, float]]] = {}
    running = Deployment.objects.filter(state__in=HELD_STATES)
    for row in running.exclude(pk=exclude_id) if exclude_id is not None else running:
        if not gpus:
            held.setdefault(POOL, []).append((row, holds_gib(row)))
            continue
        for index, gib in held_by(row, gpus):
            held.setdefault(index, []).append((row, gib))
    return gpus, held


def devices(exclude_id: int | None = None) -> list[Device]:
    """Each device with what is free on it: its size less the larger of what the records
    say engines hold and what the driver says is used (an engine still loading holds less
    than it will; a stopped one's memory may not be released yet)."""
    gpus, held = holdings_by_device(exclude_id)
    if not gpus:
        capacity = capacity_gib()
        on_pool = sum(gib for _, gib in held.get(POOL, []))
        return [Device(POOL, capacity, capacity - on_pool)]
    return [
        Device(
            g.index,
            g.total_gib,
            g.total_gib - max(sum(gib for _, gib in held.get(g.index, [])), g.used_gib or 0.0),
        )
        for g in gpus
    ]


def engines_on(exclude_id: int | None = None, leaving: bool = True) -> dict[int, int]:
    """How many deployments have an engine on each GPU (`leaving`: those stopping too)."""
    _, held = holdings_by_device(exclude_id)
    # An engine asleep is not loaded, whatever it still holds.
    return {
        index: len(
            {
                row.pk
                for row, _ in on
                if row.state != State.ASLEEP and (leaving or row.state != State.STOPPING)
            }
        )
        for index, on in held.items()
    }


def open_devices(now: list[Device], counts: dict[int, int]) -> list[Device]:
    """The GPUs with fewer engines than MSHIP_MAX_LOADED_PER_GPU (every one without a cap)."""
    cap = int(settings.MSHIP_MAX_LOADED_PER_GPU)
    if cap <= 0 or not gpu_inventory():
        return now
    return [d for d in now if counts.get(d.index, 0) < cap]


def check_fit(deployment: Deployment, *, alongside_itself: bool = False) -> list[list[int]]:
    """Place the deployment and return each replica's GPUs (none on a pool host, or for an
    engine that takes no GPU); InsufficientMemory when it does not fit now, or fits only on
    GPUs that hold MSHIP_MAX_LOADED_PER_GPU engines already.

    ``alongside_itself`` counts the deployment's running engine as held, for a blue-green
    replacement that runs the new engine beside the old one.
    """
    on_gpus = bool(gpu_inventory())
    demand = demand_of(deployment, on_gpus)
    if demand is None:
        return []
    exclude = None if alongside_itself else deployment.pk
    now = devices(exclude_id=exclude)
    usable = open_devices(now, engines_on(exclude))
    try:
        placed = placement.place(demand, usable)
    except NoRoom as exc:
        if len(usable) < len(now):
            cap = settings.MSHIP_MAX_LOADED_PER_GPU
            full = ", ".join(str(d.index) for d in now if d not in usable)
            where = f"GPUs {full} hold {cap} engines, the most MSHIP_MAX_LOADED_PER_GPU allows"
            free = sum(max(0.0, d.free_gib) for d in usable)
            raise InsufficientMemory(
                deployment.name,
                need_gib(deployment),
                free,
                sum(d.total_gib for d in now),
                where=where,
            ) from exc
        raise refusal(deployment, demand, now, exc) from exc
    return placed if on_gpus else []


def check_fit_more(deployment: Deployment, replicas: int = 1) -> list[list[int]]:
    """Place `replicas` more replicas of a running deployment beside what it runs (a scale
    up); InsufficientMemory when they do not fit now."""
    on_gpus = bool(gpu_inventory())
    demand = demand_of(deployment, on_gpus)
    if demand is None:
        return [[] for _ in range(replicas)]
    more = Demand(replicas=replicas, devices=demand.devices, gib=demand.gib, share=demand.share)
    now = devices()
    try:
        placed = placement.place(more, now)
    except NoRoom as exc:
        raise refusal(deployment, more, now, exc) from exc
    return placed if on_gpus else [[] for _ in range(replicas)]


def short_of_room(deployment_id: int) -> bool:
    """Whether a deployment that waits to start still would not fit once the stops under way
    release their memory: make-room's check on fresh rows, before each victim's stop."""
    row = Deployment.objects.filter(pk=deployment_id).first()
    if row is None or row.state not in (*STARTABLE_STATES, State.ASLEEP):
        return False  # gone, or started meanwhile (another process): no room to make
    demand = demand_of(row, bool(gpu_inventory()))
    if demand is None:
        return False
    _, held = holdings_by_device(exclude_id=row.pk)
    leaving = [
        (i, gib) for i, on in held.items() for other, gib in on if other.state == State.STOPPING
    ]
    freed = placement.freed(devices(exclude_id=row.pk), leaving)
    return not placement.fits(demand, open_devices(freed, engines_on(row.pk, leaving=False)))


def check_fit_where(deployment: Deployment, placed: list[list[int]]) -> None:
    """The fit check of a start that must go where it ran (a sleeping engine's wake)."""
    on_gpus = bool(gpu_inventory())
    demand = demand_of(deployment, on_gpus)
    if demand is None:
        return
    now = devices(exclude_id=deployment.pk)
    try:
        placement.fits_where(demand, now, placed if on_gpus else [[POOL]] * demand.replicas)
    except NoRoom as exc:
        raise refusal(deployment, demand, now, exc) from exc


def refusal(
    deployment: Deployment, demand: Demand, now: list[Device], exc: NoRoom
) -> InsufficientMemory:
    need = need_gib(deployment)
    capacity = sum(d.total_gib for d in now)
    free = sum(max(0.0, d.free_gib) for d in now)
    if not gpu_inventory():
        return InsufficientMemory(deployment.name, need, free, capacity)
    # What must be freed at least: the smallest shortfalls of as many devices as it needs.
    shorts = sorted(row.short_gib for row in exc.devices)
    least = sum(shorts[: demand.devices])
    return InsufficientMemory(
        deployment.name, need, free, capacity, exc.devices, shortfall_gib=least, where=str(exc)
    )


def host_summary() -> dict[str, Any]:
    capacity = capacity_gib()
    used = used_gib()
    gpus, held_on = holdings_by_device()
    rows = {row.pk: row for on_device in held_on.values() for row, _ in on_device}
    holding = {pk: 0.0 for pk in rows}
    for on_device in held_on.values():
        for row, gib in on_device:
            holding[row.pk] += gib
    # A running engine placed on no GPU holds nothing here, but is listed all the same.
    for row in Deployment.objects.filter(state__in=HOLDING_STATES).exclude(pk__in=list(rows)):
        rows[row.pk], holding[row.pk] = row, 0.0
    held = float(sum(holding.values()))
    pinned = float(
        sum(gib for pk, gib in holding.items() if rows[pk].effective_mode == Mode.ALWAYS_ON)
    )
    free_now = {d.index: d.free_gib for d in devices()}
    return {
        "capacity_gib": round(capacity, 3),
        "held_gib": round(held, 3),
        "free_gib": round(sum(free_now.values()), 3),
        # What on-demand deployments can ever use: capacity less always-on and system holdings.
        "on_demand_capacity_gib": round(capacity - pinned, 3),
        "used_gib": None if used is None else round(used, 3),
        "placement": "per GPU (pack)" if gpus else "one pool",
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "total_gib": round(g.total_gib, 3),
                "held_gib": round(sum(gib for _, gib in held_on.get(g.index, [])), 3),
                "used_gib": None if g.used_gib is None else round(g.used_gib, 3),
                "free_gib": round(free_now[g.index], 3),
                "deployments": [
                    {"name": row.name, "holding_gib": round(gib, 3)}
                    for row, gib in held_on.get(g.index, [])
                ],
            }
            for g in gpus
        ],
        "deployments": [
            {
                "id": row.pk,
                "name": row.name,
                "state": row.state,
                "mode": row.effective_mode,
                "holding_gib": round(holding[row.pk], 3),
                "gpus": row.gpus or [],
            }
            for row in sorted(rows.values(), key=lambda r: r.name)
        ],
    }
