"""Loaders for the engine servers Modelship ships itself (deployments/engines/)."""

from __future__ import annotations

import json
import sys
from typing import ClassVar

from django.conf import settings

from deployments import engine_envs, estimate
from deployments.engines.tts_backends import backend_name
from deployments.loaders.base import EngineSpec, Loader
from deployments.loaders.defaults import RequestDefaults, count, number

BACKENDS = ("espeak", "piper", "kokoro")


class ShippedEngineLoader(Loader):
    """An engine that is a module of this project, run with the project's own Python or,
    where it needs heavy dependencies, with its engine family's."""

    module: ClassVar[str]

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        family = self.engine_family(spec, container)
        if family:  # in a container too: the host's environment, mounted at its own path
            python = engine_envs.python(family)
        else:
            python = settings.MSHIP_CONTAINER_PYTHON if container else sys.executable
        argv = [python, "-m", self.module, "--model", spec.model]
        argv += ["--host", host, "--port", str(port)]
        argv += ["--served-model-name", *spec.served_names]
        if spec.config:
            argv += ["--config", json.dumps(spec.config, sort_keys=True)]
        return argv

    def image(self, spec: EngineSpec) -> str:
        return str(settings.MSHIP_ENGINE_IMAGE)


class ProgramOrShippedLoader(ShippedEngineLoader):
    """An engine whose own server program runs where one is given (`binary`, its variable,
    on PATH, or in its image on the docker runtime), else Modelship's server for it, in the
    engine environment `family`."""

    family: ClassVar[str]

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        binary = self.program(spec, container)
        if binary is None:
            return super().argv(spec, host, port, container)
        return self.program_argv(binary, spec, host, port)

    def program_argv(self, binary: str, spec: EngineSpec, host: str, port: str) -> list[str]:
        """The engine's own server's command line."""
        raise NotImplementedError

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        return self.family if self.program(spec, container) is None else None

    def image(self, spec: EngineSpec) -> str:
        return self.default_image  # a container runs the image's own server


class SimulatedLoader(ShippedEngineLoader):
    name = "simulated"
    config_key = "simulated_config"
    module = "deployments.engines.simulated"
    config_options: ClassVar[dict[str, str]] = {
        "startup_delay_s": "seconds before it answers its health check",
        "tokens_per_second": "how fast it streams its reply (default 200)",
        "reply": "what it answers",
        "echo": "answer with the prompt instead",
        "max_tokens": "the length of an answer whose request names none, in tokens",
        "temperature": "the temperature of a request that sets none (it says so; 1 by default)",
        "top_p": "the top_p of a request that sets none (it says so; 1 by default)",
        "max_output_tokens": "the most tokens a request may ask for (32768; more is a 400)",
        "reasoning": "reasoning text sent before the answer",
        "tool_call": "call a tool the request offers",
        "memory_claim_gib": "the memory it says it needs (GiB)",
        "fail_at_start": "exit at start, as a broken engine does",
        "crash_after_requests": "exit after this many requests",
        "ignore_sigterm": "stay up after SIGTERM (Modelship then kills it)",
        "embedding_dim": "the embeddings' dimensions (default 16)",
        "allocate_mib": "memory really allocated at start (MiB)",
        "first_token_delay_s": "seconds before each answer's first byte",
        "vision": "it takes images, as a vision model does",
        "enable_sleep_mode": "it sleeps, as vLLM's sleep mode does",
        "ignore_sleep": "it takes a sleep and stays awake, as vLLM's CPU worker does",
        "download": "it fetches its weights into the model cache at start",
        "needs_gib": "given less memory than this, it fails at start as out of memory; once"
        " started it holds this much (really allocated, as an engine's weights are)",
        "out_of_memory": "how it says so: cuda, vllm or llama (as those engines do)",
    }
    usecases = frozenset({"generate", "embed", "transcription", "translation"})
    running_gauge = "vllm:num_requests_running"
    waiting_gauge = "vllm:num_requests_waiting"
    native_responses = True
    tokenizer = "vllm"  # it stands in for vLLM

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return {
            "generate": ("chat/completions", "completions", "responses", "messages"),
            "embed": ("embeddings",),
            "transcription": ("audio/transcriptions",),
            "translation": ("audio/translations",),
        }.get(spec.usecase, ())

    def sees_images(self, spec: EngineSpec) -> bool:
        return bool(spec.config.get("vision"))

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        # What it is given, as vLLM is given a share of its GPU: below its `needs_gib` it
        # fails as an engine out of memory does.
        given = [] if spec.memory_gib is None else ["--memory-gib", str(spec.memory_gib)]
        return [*super().argv(spec, host, port, container), *given]

    def reads_files(self, spec: EngineSpec) -> bool:
        return bool(spec.config.get("vision"))  # it stands in for a multimodal model

    def can_sleep(self, spec: EngineSpec) -> bool:
        return bool(spec.config.get("enable_sleep_mode"))  # as vLLM's flag

    def request_defaults(self, spec: EngineSpec) -> RequestDefaults:
        config = spec.config
        return RequestDefaults(
            temperature=number(config.get("temperature")),
            top_p=number(config.get("top_p")),
            max_output_tokens=count(config.get("max_tokens")),
        )

    def estimate_memory_gib(self, spec: EngineSpec) -> float | None:
        claim = spec.config.get("memory_claim_gib")
        return float(claim) if claim is not None else None


class DiffusersLoader(ShippedEngineLoader):
    name = "diffusers"
    config_key = "diffusers_config"
    module = "deployments.engines.diffusers_server"
    config_options: ClassVar[dict[str, str]] = {
        "torch_dtype": "float16, bfloat16 or float32 (default: float16 on CUDA, else float32)",
        "device": "cpu or cuda (default: CUDA where there is one)",
        "num_inference_steps": "denoising steps when a request names none, 1 to 999 (4)",
        "guidance_scale": "classifier-free guidance scale (default: the pipeline's)",
    }
    usecases = frozenset({"image"})
    running_gauge = "modelship_image_requests_running"
    waiting_gauge = "modelship_image_requests_waiting"
    imports_model_code = True

    def validate(self, spec: EngineSpec) -> list[str]:
        problems = super().validate(spec)
        steps = spec.config.get("num_inference_steps", 4)
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 999:
            problems.append(f"{self.config_key}: num_inference_steps is 1 to 999")
        return problems

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        return "diffusers"

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        return estimate.scaled_file(spec.model, 1.25, 0.5, "the pipeline's weights")

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return ("images/generations", "images/edits")


class TtsLoader(ShippedEngineLoader):
    name = "tts"
    config_key = "tts_config"
    module = "deployments.engines.tts_server"
    config_options: ClassVar[dict[str, str]] = {
        "backend": "espeak, piper or kokoro (default: from the model)",
        "voices": "Kokoro's voices file (default: voices-v1.0.bin beside the model)",
        "voice": "the default voice",
        "voices_allowed": "the only voices a request may ask for, as a list",
        "voice_map": "OpenAI's voice names to the backend's, as a mapping",
        "lang": "Kokoro's phoneme language (default en-us)",
    }
    usecases = frozenset({"tts"})
    path_options = ("voices",)
    # The backends whose dependencies live in an engine environment of their own.
    families: ClassVar[dict[str, str]] = {"piper": "piper", "kokoro": "kokoro"}

    def validate(self, spec: EngineSpec) -> list[str]:
        problems = super().validate(spec)
        backend = backend_name(spec.model, spec.config)
        if backend not in BACKENDS:
            problems.append(f"{self.config_key}: backend {backend!r} is not one of {BACKENDS}")
        voice_map = spec.config.get("voice_map", {})
        if not isinstance(voice_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in voice_map.items()
        ):
            problems.append(f"{self.config_key}: voice_map maps voice names to voice names")
        return problems

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        return self.families.get(backend_name(spec.model, spec.config))

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return ("audio/speech",)


class CustomLoader(ShippedEngineLoader):
    """A plugin (deployments/engines/plugin_api.py) served by Modelship's plugin server, in
    the plugin's own engine environment."""

    name = "custom"
    config_key = "custom_config"
    module = "deployments.engines.plugin_server"
    config_options: ClassVar[dict[str, str]] = {
        "plugin": "the plugin: a folder under plugins/ or a package name",
        "options": "the plugin's own options, as a mapping",
        "voice": "the default voice",
        "voice_map": "OpenAI's voice names to the plugin's, as a mapping",
        "voices_allowed": "the only voices a request may ask for, as a list",
    }
    usecases = frozenset({"tts", "transcription", "translation", "embed", "image"})
    takes_plugins = True

    def validate(self, spec: EngineSpec) -> list[str]:
        problems = super().validate(spec)
        plugin = spec.config.get("plugin")
        if not isinstance(plugin, str) or not plugin:
            problems.append(f"{self.config_key}: 'plugin' names the plugin (plugins/ or a package)")
        else:
            try:
                engine_envs.plugin_family(plugin)
            except engine_envs.EnvFailed as exc:
                problems.append(f"{self.config_key}: {exc}")
        if not isinstance(spec.config.get("options", {}), dict):
            problems.append(f"{self.config_key}: 'options' is a mapping, given to the plugin")
        return problems

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        return engine_envs.plugin_family(str(spec.config.get("plugin", "")))

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return {
            "tts": ("audio/speech",),
            "transcription": ("audio/transcriptions", "audio/translations"),
            "translation": ("audio/transcriptions", "audio/translations"),
            "embed": ("embeddings",),
            "image": ("images/generations", "images/edits"),
        }.get(spec.usecase, ())
