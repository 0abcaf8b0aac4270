"""llama.cpp's `llama-server`, serving a GGUF file.

The engine is the `llama-server` binary where one is configured or on PATH (or in the
published image), else llama.cpp's own server from the `xllamacpp` wheel, started by the
project's launcher with the same flags (`binary: xllamacpp` asks for it anywhere, in a
container too)."""

from __future__ import annotations

import sys
from typing import ClassVar

from django.conf import settings

from deployments import programs
from deployments.loaders.base import EngineSpec, Loader, file_size_gib

LAUNCHER = "xllamacpp"


class LlamaServerLoader(Loader):
    name = "llama_server"
    config_key = "llama_server_config"
    config_options: ClassVar[dict[str, str]] = {
        "n_ctx": "context size in tokens (--ctx-size; default 4096)",
        "n_gpu_layers": "layers offloaded to the GPU (-ngl; default: all with num_gpus, else 0)",
        "parallel": "requests served at once, sharing the context (--parallel)",
        "pooling": "an embedding model's pooling: mean, cls, last or none (--pooling)",
        "threads": "CPU threads (--threads)",
        "binary": "the llama-server program to run (default: MSHIP_LLAMA_SERVER_BIN or PATH)",
        "extra_args": "more llama-server arguments, as a list of strings",
        "mmproj": "a vision projector file: the model then takes images (--mmproj)",
    }
    usecases = frozenset({"generate", "embed"})
    running_gauge = "llamacpp:requests_processing"
    waiting_gauge = "llamacpp:requests_deferred"
    tokenizer = "llama"
    default_image = "ghcr.io/ggml-org/llama.cpp:server"
    binary_name = "llama-server"
    binary_env = "MSHIP_LLAMA_SERVER_BIN"
    container_binary = "/app/llama-server"
    context_option = "n_ctx"
    context_default = 4096  # llama-server's -c, as argv() passes it
    # KV cache and compute buffers on top of the weights, per 1k tokens of context (rough).
    context_gib_per_1k: ClassVar[float] = 0.02

    def validate(self, spec: EngineSpec) -> list[str]:
        problems = super().validate(spec)
        if spec.num_gpus and spec.num_gpus != int(spec.num_gpus):
            problems.append("num_gpus must be a whole number for llama_server")
        extra = spec.config.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            problems.append(f"{self.config_key}: 'extra_args' must be a list of strings")
        return problems

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        cfg = spec.config
        argv = [*self.command(spec, container), "-m", spec.model]
        argv += ["--host", host, "--port", str(port)]
        argv += ["--alias", spec.name, "--metrics", "--jinja"]
        argv += ["-c", str(cfg.get("n_ctx", 4096))]
        n_gpu_layers = cfg.get("n_gpu_layers", 999 if spec.num_gpus else 0)
        argv += ["-ngl", str(n_gpu_layers)]
        if "parallel" in cfg:
            argv += ["--parallel", str(cfg["parallel"])]
        if "threads" in cfg:
            argv += ["--threads", str(cfg["threads"])]
        if "mmproj" in cfg:  # the vision projector: the model then takes images
            argv += ["--mmproj", str(cfg["mmproj"])]
        if spec.usecase == "embed":
            argv += ["--embedding", "--pooling", str(cfg.get("pooling", "mean"))]
        return argv + list(cfg.get("extra_args", []))

    def command(self, spec: EngineSpec, container: bool) -> list[str]:
        configured = spec.config.get("binary")
        installed = programs.find(self.binary_name, self.binary_env)
        if configured == LAUNCHER or (not configured and not container and not installed):
            python = settings.MSHIP_CONTAINER_PYTHON if container else sys.executable
            return [python, "-m", "deployments.engines.llama_launcher"]
        return [self.binary(spec, container)]

    def image(self, spec: EngineSpec) -> str:
        # The launcher runs from Modelship's own image, where the wheel is installed.
        if spec.config.get("binary") == LAUNCHER:
            return str(settings.MSHIP_ENGINE_IMAGE)
        return self.default_image

    def sees_images(self, spec: EngineSpec) -> bool:
        return "mmproj" in spec.config

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        if spec.usecase == "embed":
            # llama-server answers /rerank only when started for it; any other embedding
            # server answers 501, which the gateway turns into 404 unsupported_endpoint.
            return ("embeddings", "rerank") if reranks(spec.config) else ("embeddings",)
        return ("chat/completions", "completions", "messages")

    def estimate_memory_gib(self, spec: EngineSpec) -> float | None:
        weights = file_size_gib(spec.model)
        if weights is None:
            return None
        n_ctx = int(spec.config.get("n_ctx", 4096))
        return round(weights * 1.1 + self.context_gib_per_1k * n_ctx / 1024, 3)


def reranks(cfg: dict[str, object]) -> bool:
    """Whether llama-server is started for reranking: `pooling: rank`, or --reranking (or
    --rerank, or --pooling rank) among its extra_args, the last word on pooling winning as it
    does on llama-server's command line."""
    ranked = cfg.get("pooling") == "rank"
    extra = cfg.get("extra_args")
    args = [str(a) for a in extra] if isinstance(extra, list) else []
    for i, arg in enumerate(args):
        if arg in ("--reranking", "--rerank"):
            ranked = True
        elif arg == "--pooling" and i + 1 < len(args):
            ranked = args[i + 1] == "rank"
        elif arg.startswith("--pooling="):
            ranked = arg.partition("=")[2] == "rank"
    return ranked
