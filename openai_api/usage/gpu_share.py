"""A deployment's GPU share: what one of its replicas holds of the host's GPUs, the figure
GPU-seconds are counted in (README, "Usage and budgets").

`num_gpus` where the deployment sets it (a fraction for an engine that shares a GPU: vLLM's
0.5 is half of one); else the GPUs its replica was placed on; 0 for an engine on CPUs only,
which uses no GPU-seconds."""

from __future__ import annotations

from typing import Any


def replica_shares(num_gpus: float | None, gpus: Any, replicas: int) -> tuple[float, ...]:
    """Each replica's share, in the order of its engine URLs."""
    placed = [g for g in gpus if isinstance(g, list)] if isinstance(gpus, list) else []
    shares = []
    for index in range(max(replicas, len(placed), 0)):
        if num_gpus is not None:
            shares.append(float(num_gpus))
        elif index < len(placed):
            shares.append(float(len(placed[index])))
        else:
            shares.append(0.0)
    return tuple(shares)
