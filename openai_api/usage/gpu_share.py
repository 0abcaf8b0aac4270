"""A replica's GPU share: what it holds of the host's GPUs, the figure GPU-seconds are counted
in (README, "Usage and budgets").

`num_gpus` where the deployment sets it (a fraction for an engine that shares a GPU: vLLM's
0.5 is half of one); else the memory it holds over the size of the GPU it was placed on (a
20 GiB model on an 80 GiB GPU holds 0.25 of it). On a host without GPUs, the same over the
memory budget: its "GPU-seconds" are then seconds of the whole budget (`basis`), so a CPU
site's figures still say who used what. A replica whose memory is not known holds 0."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deployments import memory
from deployments.learned import learned_here
from deployments.models import Runtime

if TYPE_CHECKING:
    from deployments.nvml import GpuReading

GPUS = "gpus"
BUDGET = "memory budget"


def basis(gpus: list[GpuReading] | None = None) -> str:
    """What a share is of on this host: its GPUs, or (none) its memory budget."""
    return GPUS if (memory.gpu_inventory() if gpus is None else gpus) else BUDGET


def replica_shares(
    deployment: Any, replicas: int, gpus: list[GpuReading] | None = None
) -> tuple[float, ...]:
    """Each of its replicas' share, in the order of its engine URLs (`gpus`: the host's
    inventory, where the caller read it already)."""
    count = max(replicas, 0)
    if deployment.num_gpus is not None:
        return (max(0.0, float(deployment.num_gpus)),) * count
    if getattr(deployment, "runtime", None) == Runtime.RAY:
        return (0.0,) * count  # placed by Ray on its own nodes, by num_gpus alone
    gpus = memory.gpu_inventory() if gpus is None else gpus
    learned = learned_here(deployment)
    declared = deployment.memory_gib
    gib = max(float(declared) if declared is not None else memory.estimate_gib(deployment), learned)
    if gib <= 0:
        return (0.0,) * count
    if not gpus:
        return (min(1.0, gib / memory.capacity_gib()),) * count
    sizes = {gpu.index: gpu.total_gib for gpu in gpus}
    placed = deployment.gpus if isinstance(deployment.gpus, list) else []
    shares = []
    for index in range(count):
        on = placed[index] if index < len(placed) and isinstance(placed[index], list) else []
        devices = [sizes[i] for i in on if i in sizes] or [gpus[0].total_gib]
        # Split evenly over the GPUs it spans, each part a share of its own GPU.
        shares.append(sum(min(1.0, gib / len(devices) / size) for size in devices if size > 0))
    return tuple(shares)
