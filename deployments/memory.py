"""The memory budget: what the host can hold, what deployments hold, and the fit check."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from deployments import nvml
from deployments.loaders import EngineSpec, get_loader
from deployments.models import HOLDING_STATES, Deployment, Mode
from deployments.refusals import OperationRefused

log = logging.getLogger(__name__)


class InsufficientMemory(OperationRefused):
    code = "insufficient_memory"

    def __init__(self, name: str, need_gib: float, free_gib: float, capacity_gib: float) -> None:
        self.name = name
        self.need_gib = round(need_gib, 3)
        self.free_gib = round(free_gib, 3)
        self.capacity_gib = round(capacity_gib, 3)
        self.shortfall_gib = round(need_gib - free_gib, 3)
        super().__init__(
            f"{name} needs {self.need_gib} GiB but {self.free_gib} GiB of "
            f"{self.capacity_gib} GiB is free (short by {self.shortfall_gib} GiB)"
        )

    def extra(self) -> dict[str, Any]:
        return {
            "shortfall_gib": self.shortfall_gib,
            "need_gib": self.need_gib,
            "free_gib": self.free_gib,
            "capacity_gib": self.capacity_gib,
        }


def capacity_gib() -> float:
    """Usable accelerator memory of this host."""
    configured = settings.MSHIP_MEMORY_CAPACITY_GIB
    if configured:
        return float(configured)
    gpus = nvml.readings()
    if gpus:
        return sum(gpu.total_gib for gpu in gpus)
    return float(settings.MSHIP_DEFAULT_CAPACITY_GIB)


def used_gib() -> float | None:
    """Accelerator memory in use now, as the driver reports it; None without GPUs."""
    gpus = nvml.readings()
    return sum(gpu.used_gib for gpu in gpus) if gpus else None


def gpu_memory_gib() -> float:
    """The size of one GPU, which a deployment's num_gpus is a fraction of."""
    if settings.MSHIP_GPU_MEMORY_GIB:
        return float(settings.MSHIP_GPU_MEMORY_GIB)
    gpus = nvml.readings()
    return gpus[0].total_gib if gpus else capacity_gib()


def need_gib(deployment: Any) -> float:
    """Memory one deployment holds while it runs: per replica, times its replicas."""
    if deployment.memory_gib is not None:
        per_replica = float(deployment.memory_gib)
    elif deployment.num_gpus is not None:
        per_replica = float(deployment.num_gpus) * gpu_memory_gib()
    else:
        estimate = get_loader(deployment.loader).estimate_memory_gib(EngineSpec.of(deployment))
        per_replica = estimate or 0.0
    return per_replica * max(1, int(deployment.num_replicas or 1))


def holdings() -> list[tuple[Deployment, float]]:
    return [(d, need_gib(d)) for d in Deployment.objects.filter(state__in=HOLDING_STATES)]


def held_gib(exclude_id: int | None = None) -> float:
    return sum(gib for d, gib in holdings() if d.pk != exclude_id)


def check_fit(deployment: Deployment, *, alongside_itself: bool = False) -> float:
    """Raise InsufficientMemory unless the deployment fits in what is free; return its need.

    ``alongside_itself`` counts the deployment's running engine as held, for a blue-green
    replacement that runs the new engine beside the old one.
    """
    need = need_gib(deployment)
    capacity = capacity_gib()
    held = held_gib(exclude_id=None if alongside_itself else deployment.pk)
    # The records say what engines will hold; the driver says what is held now. The larger
    # wins: an engine still loading holds less than it will, and a stopped one's memory
    # may not be released yet.
    free = capacity - max(held, used_gib() or 0.0)
    if need > free + 1e-9:
        raise InsufficientMemory(deployment.name, need, free, capacity)
    return need


def host_summary() -> dict[str, Any]:
    capacity = capacity_gib()
    used = used_gib()
    rows = holdings()
    held = float(sum(gib for _, gib in rows))
    pinned = float(sum(gib for d, gib in rows if d.effective_mode == Mode.ALWAYS_ON))
    return {
        "capacity_gib": round(capacity, 3),
        "held_gib": round(held, 3),
        "free_gib": round(capacity - max(held, used or 0.0), 3),
        # What on-demand deployments can ever use: capacity less always-on and system holdings.
        "on_demand_capacity_gib": round(capacity - pinned, 3),
        "used_gib": None if used is None else round(used, 3),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "total_gib": round(g.total_gib, 3),
                "used_gib": round(g.used_gib, 3),
            }
            for g in nvml.readings()
        ],
        "deployments": [
            {
                "id": d.pk,
                "name": d.name,
                "state": d.state,
                "mode": d.effective_mode,
                "holding_gib": round(gib, 3),
            }
            for d, gib in rows
        ],
    }
