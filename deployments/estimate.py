"""How much memory a deployment's engine will hold, from its model's own metadata, before it
starts: the weights, the cache its context asks for, and the engine's overhead.

    llama.cpp   weights = the GGUF file (its tensors, mmapped and read whole)
                cache   = 2 (K, V) x layers x n_ctx x KV heads x head size x 2 bytes (f16)
                          (head size: the header's key/value length, else embedding / heads;
                          n_ctx is the whole context, shared by the `parallel` slots)
                overhead = 0.05 GiB + 10 % of the weights (compute buffers, the server)
                           on a GPU 0.35 GiB + 10 % (CUDA's context and buffers)
    vLLM        weights = the safetensors (their bytes), else the folder's weight files
                cache   = one whole sequence: 2 x layers x max_model_len x KV heads x head
                          size x 2 bytes (1 with an fp8 kv_cache_dtype); on CPU, the KV
                          space its CPU build is given, where that is more
                overhead = 1 GiB + 10 % of the weights (activations, CUDA graphs, sampler);
                           on CPU 1.8 GiB + 10 % (three processes, each with torch)
    diffusers   weights x 1.25 + 0.5 GiB (the pipeline's activations at its resolution)
    whisper.cpp, stable-diffusion.cpp  the file x 1.1 + 0.1 GiB (+ 0.4 GiB for images)
    faster-whisper  the folder x 1.5 (weights as float32 on CPU); a Piper voice x 1.5 + 0.1

Reads are cached by path, size and modification time, and bounded (deployments/store/
metadata.py): a page listing deployments never reads a model's weights.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deployments.store.metadata import Described, describe

GIB = 2**30
CPU_PROCESSES_GIB = 1.8  # vLLM's CPU build: its API server, engine core and worker
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".ckpt")


@dataclass(frozen=True)
class Estimate:
    gib: float
    weights_gib: float
    cache_gib: float
    overhead_gib: float
    basis: str  # what it was read from
    # One full-length sequence's KV cache (vLLM: max_model_len tokens); 0 where the engine's
    # cache is not counted in sequences.
    sequence_gib: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def made(
    weights: float, cache: float, overhead: float, basis: str, sequence: float = 0.0
) -> Estimate:
    total = weights + cache + overhead
    return Estimate(round(total, 3), weights, cache, overhead, basis, sequence)


@functools.lru_cache(maxsize=256)
def _facts(path: str, size: int, mtime: float) -> tuple[int, Described] | None:
    try:
        found = describe(Path(path))
    except OSError:
        return None
    return weights_bytes(Path(path), found), found


def facts(path: str) -> tuple[int, Described] | None:
    """The bytes of a model's weights and what its metadata says; None where it is not a
    model on this host (a hub id, a missing path)."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    return _facts(path, stat.st_size, stat.st_mtime)


def weights_bytes(path: Path, described: Described) -> int:
    if path.is_file():
        return path.stat().st_size
    files = [p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    chosen = safetensors or files  # a repo with both formats loads the safetensors
    return sum(p.stat().st_size for p in chosen)


def kv_bytes_per_token(details: dict[str, Any], element_bytes: float) -> float | None:
    """The K and V cache one token takes: layers x KV heads x (key + value size) x bytes."""
    layers, heads, width = (details.get(k) for k in ("layers", "heads", "embedding_length"))
    kv_heads = details.get("kv_heads") or heads
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(kv_heads, int)):
        return None
    if min(layers, heads, kv_heads) <= 0:
        return None
    head = details.get("key_length") or (width // heads if isinstance(width, int) else 0)
    value = details.get("value_length") or head
    if not (isinstance(head, int) and isinstance(value, int) and head > 0 and value > 0):
        return None
    return float(layers * kv_heads * (head + value) * element_bytes)


def llama_cpp(path: str, n_ctx: int, on_gpu: bool) -> Estimate | None:
    found = facts(path)
    if found is None:
        return None
    size, described = found
    weights = size / GIB
    per_token = kv_bytes_per_token(described.details, 2.0)
    cache = (per_token or 0.0) * n_ctx / GIB
    overhead = (0.35 if on_gpu else 0.05) + 0.1 * weights
    basis = "GGUF header" if per_token else "file size (no layers or heads in its header)"
    return made(weights, cache, overhead, basis)


def vllm(
    path: str, max_model_len: int | None, fp8: bool, cpu_cache_gib: float | None = None
) -> Estimate | None:
    """On a GPU; or, given the KV space its CPU build is given (`cpu_cache_gib`), on CPU,
    where that space is taken whatever the model needs and each of its processes holds
    torch (1.8 GiB for the three, measured)."""
    found = facts(path)
    if found is None:
        return None
    size, described = found
    weights = size / GIB
    per_token = kv_bytes_per_token(described.details, 1.0 if fp8 else 2.0)
    length = max_model_len or described.details.get("context_length")
    cache = (per_token or 0.0) * (length or 0) / GIB
    basis = "config.json and safetensors" if per_token and length else "weights only"
    if cpu_cache_gib is not None:
        overhead = CPU_PROCESSES_GIB + 0.1 * weights
        return made(weights, max(cache, cpu_cache_gib), overhead, basis, cache)
    return made(weights, cache, 1.0 + 0.1 * weights, basis, cache)


def scaled_file(path: str, factor: float, extra: float, basis: str) -> Estimate | None:
    found = facts(path)
    if found is None:
        return None
    weights = found[0] / GIB
    return made(weights, 0.0, weights * (factor - 1) + extra, basis)
