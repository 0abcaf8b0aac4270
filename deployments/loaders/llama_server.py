"""llama.cpp's `llama-server`, serving a GGUF file.

The engine is the `llama-server` binary where one is configured or on PATH (or in the
published image), else llama.cpp's own server from the `xllamacpp` wheel, started by the
project's launcher with the same flags (`binary: xllamacpp` asks for it anywhere, in a
container too)."""

from __future__ import annotations

import sys
from typing import ClassVar

from django.conf import settings

from deployments import estimate, programs
from deployments.loaders.base import (
    EngineSpec,
    Loader,
    extra_args_problems,
    whole_number,
    whole_number_problems,
)
from deployments.loaders.defaults import RequestDefaults, llama_server

LAUNCHER = "xllamacpp"
POOLINGS = ("mean", "cls", "last", "none", "rank")
# More slots than this are left to the engine to place requests in (the gateway's table of
# them stays small).
MAX_PINNED_SLOTS = 1024


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
    # --api-key's variable (llama.cpp's common/arg.cpp; the launcher reads it too): every
    # route but /health needs the key then, /metrics and /slots included.
    secret_env = "LLAMA_API_KEY"
    context_option = "n_ctx"
    context_default = 4096  # llama-server's -c, as argv() passes it
    names_forced_tool = False  # "Wrong type supplied for parameter 'tool_choice'"
    # Tuning and sampling defaults. Not here: anything naming a file (--log-file,
    # --slot-save-path, --lora, --chat-template-file, --path, --api-key-file, -md…), a URL
    # (-mu, --hf-*, --rpc), the address (--host, --port), --props (clients would change the
    # server's settings) and --verbose (it logs every prompt).
    operator_flags = frozenset(
        {
            "c", "ctx-size", "t", "threads", "tb", "threads-batch", "b", "batch-size", "ub",
            "ubatch-size", "np", "parallel", "cb", "cont-batching", "nocb", "no-cont-batching",
            "fa", "flash-attn", "ctk", "cache-type-k", "ctv", "cache-type-v", "ngl",
            "gpu-layers", "n-gpu-layers", "sm", "split-mode", "ts", "tensor-split", "mg",
            "main-gpu", "dev", "device", "ot", "override-tensor", "cpu-moe", "ncmoe",
            "n-cpu-moe", "mlock", "no-mmap", "numa", "n", "predict", "n-predict", "keep",
            "temp", "top-k", "top-p", "min-p", "typical", "repeat-penalty", "repeat-last-n",
            "presence-penalty", "frequency-penalty", "dry-multiplier", "dry-base",
            "dry-allowed-length", "dry-penalty-last-n", "s", "seed", "mirostat", "mirostat-lr",
            "mirostat-ent", "rope-scaling", "rope-scale", "rope-freq-base", "rope-freq-scale",
            "yarn-orig-ctx", "yarn-ext-factor", "yarn-attn-factor", "yarn-beta-slow",
            "yarn-beta-fast", "context-shift", "no-context-shift", "cache-reuse", "dt",
            "defrag-thold", "reasoning-format", "reasoning-budget", "chat-template", "no-webui",
            "to", "timeout", "threads-http", "swa-full", "kvu", "kv-unified", "nkvo",
            "no-kv-offload", "jinja", "no-warmup", "no-cache-prompt", "sps",
            "slot-prompt-similarity", "override-kv", "rerank", "reranking", "pooling", "sp",
            "special", "spm-infill", "no-perf", "log-disable", "log-colors", "log-prefix",
            "log-timestamps", "slots", "no-slots",
        }
    )  # fmt: skip
    path_options = ("mmproj",)
    # KV cache and compute buffers on top of the weights, per 1k tokens of context (rough).

    def validate(self, spec: EngineSpec) -> list[str]:
        problems = super().validate(spec)
        if spec.num_gpus and spec.num_gpus != int(spec.num_gpus):
            problems.append("num_gpus must be a whole number for llama_server")
        problems += whole_number_problems(self, spec, "n_ctx", "parallel", "threads")
        if "n_gpu_layers" in spec.config and spec.config["n_gpu_layers"] != -1:
            problems += whole_number_problems(self, spec, "n_gpu_layers")
        if spec.config.get("pooling", "mean") not in POOLINGS:
            problems.append(f"{self.config_key}: pooling is one of {', '.join(POOLINGS)}")
        return problems + extra_args_problems(self, spec)

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        cfg = spec.config
        argv = [*self.command(spec, container), "-m", spec.model]
        argv += ["--host", host, "--port", str(port)]
        argv += ["--alias", spec.name, "--metrics", "--jinja"]
        argv += ["-c", str(cfg.get("n_ctx", 4096))]
        n_gpu_layers = cfg.get("n_gpu_layers", 999 if spec.num_gpus else 0)
        argv += ["-ngl", str(n_gpu_layers)]
        # Said always, so that the slots the gateway pins requests to are the engine's
        # (llama-server's own default varies by build).
        argv += ["--parallel", str(self.batch_size(spec))]
        if "threads" in cfg:
            argv += ["--threads", str(cfg["threads"])]
        if "mmproj" in cfg:  # the vision projector: the model then takes images
            argv += ["--mmproj", str(cfg["mmproj"])]
        if spec.usecase == "embed":
            argv += ["--embedding", "--pooling", str(cfg.get("pooling", "mean"))]
        for adapter in spec.adapters:  # each off (scale 0) until a request's `lora` names it
            argv += ["--lora", adapter]
        if spec.adapters:
            argv.append("--lora-init-without-apply")
        if spec.slot_save_path:  # llama.cpp wants the separator at its end
            argv += ["--slot-save-path", spec.slot_save_path.rstrip("/") + "/"]
        return argv + list(cfg.get("extra_args", []))

    def batch_size(self, spec: EngineSpec) -> int:
        return whole_number(spec.config.get("parallel")) or 1

    def pinned_slots(self, spec: EngineSpec) -> int:
        if spec.usecase != "generate" or has_flag(spec.config, "-np", "--parallel"):
            return 0  # its extra_args set the slots: not known here
        slots = self.batch_size(spec)
        return slots if slots <= MAX_PINNED_SLOTS else 0

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

    def request_defaults(self, spec: EngineSpec) -> RequestDefaults:
        return llama_server(spec.config.get("extra_args"))

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        if spec.usecase == "embed":
            # llama-server answers /rerank only when started for it; any other embedding
            # server answers 501, which the gateway turns into 404 unsupported_endpoint.
            return ("embeddings", "rerank") if reranks(spec.config) else ("embeddings",)
        return ("chat/completions", "completions", "messages")

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        n_ctx = whole_number(spec.config.get("n_ctx", 4096)) or 4096
        return estimate.llama_cpp(spec.model, n_ctx, on_gpu=bool(spec.num_gpus))


def has_flag(cfg: dict[str, object], *names: str) -> bool:
    extra = cfg.get("extra_args")
    args = [str(a) for a in extra] if isinstance(extra, list) else []
    return any(arg.split("=", 1)[0] in names for arg in args)


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
