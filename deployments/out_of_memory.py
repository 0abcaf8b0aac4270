"""A start that failed for lack of memory, told by the engine's own words, and what it
teaches: the memory the next start claims (Deployment.learned_gib), so that the fit check
and make-room count what the engine really takes rather than the estimate it outgrew.

The words: PyTorch's "CUDA out of memory" (with "Tried to allocate X GiB" where it says how
much), vLLM's "No available memory for the cache blocks", llama.cpp's failed buffer
allocations ("cudaMalloc failed: out of memory", "unable to allocate CUDA0 buffer"). The
simulated engine fakes each (its `fail_at_start_with` option).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from deployments import learned
from deployments.memory import demand_of, gpu_inventory

if TYPE_CHECKING:
    from deployments.models import Deployment

OUT_OF_MEMORY = "Out of memory"  # how the reason of such a failed start begins
SIGNS = (
    (
        "CUDA out of memory",
        "the GPU ran out of memory while the engine loaded (CUDA out of memory)",
    ),
    (
        "No available memory for the cache blocks",
        "the model's weights left no GPU memory for vLLM's KV cache blocks",
    ),
    ("cudaMalloc failed: out of memory", "llama.cpp could not allocate its GPU buffers"),
    ("unable to allocate CUDA", "llama.cpp could not allocate its GPU buffers"),
    ("failed to allocate CUDA", "llama.cpp could not allocate its GPU buffers"),
)
TRIED = re.compile(r"(?:Tried to allocate|allocating) ([0-9]{1,9}(?:\.[0-9]{1,6})?) (GiB|MiB)")
GROWTH = 1.25  # without a figure from the engine, the next start claims a quarter more
MAX_LEARNED_GIB = 4096.0


def cause(text: str) -> str | None:
    """The failure in plain words when the engine's output says it ran out of memory."""
    return next((words for sign, words in SIGNS if sign in text), None)


def learned_need(text: str, claimed_gib: float) -> float:
    """What the next start should claim per replica: what it claimed plus what the engine
    says it tried to allocate on top, else a quarter more (at least 1 GiB more)."""
    tried = TRIED.search(text)
    if tried is not None:
        amount = float(tried.group(1)) / (1024 if tried.group(2) == "MiB" else 1)
        more = max(amount, 0.5)
    else:
        more = max(claimed_gib * (GROWTH - 1), 1.0)
    return round(min(claimed_gib + more, MAX_LEARNED_GIB), 3)


def explained(deployment: Deployment, said: str, log: str) -> tuple[str, dict[str, Any]]:
    """The reason of a start that ran out of memory, in plain words first, and the memory
    the next start claims (where the claim is in GiB: a share of whole GPUs is not)."""
    demand = demand_of(deployment, bool(gpu_inventory()))
    if demand is None or demand.gib is None:
        return f"{OUT_OF_MEMORY}: {said}.\n{log}", {}
    need = learned_need(log, demand.gib)
    words = f"the next start claims {need:g} GiB per replica instead of {demand.gib:g}"
    on = learned.gpu_model(learned.first_device(deployment))
    taught = {"learned_gib": need, "learned_on": on}
    return f"{OUT_OF_MEMORY}: {said}; {words}.\n{log}", taught
