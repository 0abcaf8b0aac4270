"""What an out-of-memory start taught a deployment to claim (`learned_gib`), where it holds:
on the GPU model it was learned on (`learned_on`; another model's memory is another figure).
How it is learned is deployments/out_of_memory.py's; how it is forgotten, footprint.py's.
"""

from __future__ import annotations

from typing import Any

from deployments import nvml

_models: dict[int, str] = {}  # device index -> its name, once NVML said it


def gpu_model(device: int | None = None) -> str:
    """The GPU model learned claims are kept for: the named device's (else the host's first);
    "" on a host without one. Names are kept once read: a moment NVML cannot answer does
    not make a claim learned on this host's GPUs look foreign."""
    if not _models:
        _models.update((g.index, g.name) for g in nvml.readings())
    if not _models:
        return ""
    return _models.get(device if device is not None else min(_models), _models[min(_models)])


def learned_here(deployment: Any) -> float:
    """The learned claim where it was learned on this host's GPU model (or on no known one:
    a host without GPUs, or before the model was kept), else 0: another model's memory is
    another figure."""
    learned = getattr(deployment, "learned_gib", None)
    if learned is None:
        return 0.0
    on = getattr(deployment, "learned_on", "") or ""
    return float(learned) if on in ("", gpu_model(first_device(deployment))) else 0.0


def first_device(deployment: Any) -> int | None:
    """The GPU its first replica was placed on, where it was."""
    placed = getattr(deployment, "gpus", None) or []
    return placed[0][0] if placed and placed[0] else None
