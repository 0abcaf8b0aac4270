"""The simulated engine's memory behaviour: vLLM's sleep endpoints at both levels (a wake
from level 2 must be followed by /collective_rpc reload_weights, or it answers nothing), and
each engine's own words for a start that ran out of memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from deployments.engines.sim_core import STATE

if TYPE_CHECKING:
    from collections.abc import Callable


async def sleep(request: web.Request) -> web.Response:
    """vLLM's levels: 1 keeps the weights in host memory, 2 discards them (a wake must then
    reload them)."""
    state = request.app[STATE]
    level = request.query.get("level", "1")
    if level not in ("1", "2"):
        return web.json_response({"error": f"level must be 1 or 2, not {level!r}"}, status=400)
    state.sleeping = not state.config.ignore_sleep
    state.sleep_level = int(level)
    return web.Response(text="")


async def wake_up(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.sleeping and state.sleep_level == 2:
        state.weights_dropped = True
    state.sleeping = False
    return web.Response(text="")


async def collective_rpc(request: web.Request) -> web.Response:
    """The one method on-demand calls: reload_weights, after a level 2 wake."""
    state = request.app[STATE]
    body = await request.json()
    if body.get("method") != "reload_weights":
        return web.json_response({"error": "only reload_weights is simulated"}, status=400)
    state.weights_dropped = False
    return web.json_response({"results": [None]})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    return web.Response(text="")


async def is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": request.app[STATE].sleeping})


# Each engine's own words for a start that ran out of memory (given the GiB it lacked).
OUT_OF_MEMORY: dict[str, Callable[[float], str]] = {
    "cuda": lambda short: (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {short:.2f} GiB."
    ),
    "vllm": lambda short: (
        "ValueError: No available memory for the cache blocks. Try increasing"
        " `gpu_memory_utilization` when initializing the engine."
    ),
    "llama": lambda short: (
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {short * 1024:.2f} MiB on"
        " device 0: cudaMalloc failed: out of memory"
    ),
}
