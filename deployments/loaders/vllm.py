"""vLLM's OpenAI-compatible server (`vllm serve`)."""

from __future__ import annotations

from typing import Any

from deployments.loaders.base import EMBED_ENDPOINTS, EngineSpec, Loader, cli_flags


class VllmLoader(Loader):
    name = "vllm"
    config_key = "vllm_engine_kwargs"
    usecases = frozenset({"generate", "embed", "transcription", "translation"})
    running_gauge = "vllm:num_requests_running"
    waiting_gauge = "vllm:num_requests_waiting"
    default_image = "vllm/vllm-openai:latest"
    can_sleep_mode = True
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

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        argv = ["vllm", "serve", spec.model, "--host", host, "--port", str(port)]
        argv += ["--served-model-name", *spec.served_names]
        options = dict(spec.config)
        if spec.num_gpus and "gpu_memory_utilization" not in options:
            # A fraction of one GPU: vLLM takes it as the share of the device it may use.
            options["gpu_memory_utilization"] = min(spec.num_gpus, 1.0)
        if spec.usecase == "embed" and "runner" not in options:
            options["runner"] = "pooling"
        return argv + cli_flags(options)

    def docker_defaults(self, spec: EngineSpec) -> dict[str, Any]:
        # vLLM's workers share tensors through /dev/shm; Docker's 64 MB default is too small.
        return {"ipc_mode": "host"}

    def env(self, spec: EngineSpec) -> dict[str, str]:
        # /sleep, /wake_up and /is_sleeping are served only in vLLM's development mode.
        return {"VLLM_SERVER_DEV_MODE": "1"} if self.can_sleep(spec) else {}

    def can_sleep(self, spec: EngineSpec) -> bool:
        return bool(spec.config.get("enable_sleep_mode"))

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
