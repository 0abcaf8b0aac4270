"""stable-diffusion.cpp: its `sd-server` program where one is given (`binary`,
MSHIP_SD_SERVER_BIN, on PATH, or in its image), else Modelship's own server on the
`stable-diffusion-cpp-python` binding (deployments/engines/sdcpp_server.py) in the sdcpp
engine environment, with the diffusers engine's routes, checks, queue and metrics."""

from __future__ import annotations

from typing import ClassVar

from deployments import estimate
from deployments.loaders.base import (
    EngineSpec,
    extra_args_problems,
    whole_number_problems,
)
from deployments.loaders.shipped import ProgramOrShippedLoader


class StableDiffusionCppLoader(ProgramOrShippedLoader):
    name = "stable_diffusion_cpp"
    config_key = "stable_diffusion_cpp_config"
    config_options: ClassVar[dict[str, str]] = {
        "threads": "CPU threads",
        "binary": "an sd-server program to run (default: Modelship's own server)",
        "extra_args": "more sd-server arguments, as a list of strings",
        "diffusion_model": "a separate diffusion model file (Flux, SD3…)",
        "vae": "a separate VAE file",
        "sample_steps": "sampling steps, 1 to 999 (default 20)",
        "cfg_scale": "classifier-free guidance scale (default 7)",
        "sample_method": "the sampler: euler_a, euler, dpm++2m…",
        "wtype": "the weights' type in memory: f16, q8_0, q4_0…",
    }
    usecases = frozenset({"image"})
    module = "deployments.engines.sdcpp_server"
    family = "sdcpp"
    binary_name = "sd-server"
    binary_env = "MSHIP_SD_SERVER_BIN"
    # stable-diffusion.cpp publishes no server image: a container runs the sd-server of the
    # image the deployment names.
    default_image = ""
    # Sampling and memory placement; every option that names a file (models, LoRA and
    # embedding folders, images, output) or the address needs run_arbitrary_engine, as does
    # --verbose (prompts in the engine's log).
    operator_flags = frozenset(
        {
            "t", "threads", "steps", "cfg-scale", "sampling-method", "scheduler", "s", "seed",
            "clip-skip", "vae-tiling", "vae-on-cpu", "clip-on-cpu", "control-net-cpu",
            "diffusion-fa", "W", "width", "H", "height", "b", "batch-count", "guidance",
            "rng", "type", "strength", "style-ratio", "slg-scale", "skip-layers",
            "skip-layer-start", "skip-layer-end", "eta", "offload-to-cpu", "color",
        }
    )  # fmt: skip
    path_options = ("diffusion_model", "vae")
    health_path = "/"  # sd-server's page; Modelship's engines answer it too
    running_gauge = "modelship_image_requests_running"
    waiting_gauge = "modelship_image_requests_waiting"

    def validate(self, spec: EngineSpec) -> list[str]:
        found = super().validate(spec)
        found += whole_number_problems(self, spec, "threads")
        found += extra_args_problems(self, spec)
        steps = spec.config.get("sample_steps", 20)
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 999:
            found.append(f"{self.config_key}: sample_steps is 1 to 999")
        return found

    def program_argv(self, binary: str, spec: EngineSpec, host: str, port: str) -> list[str]:
        cfg = spec.config
        argv = [binary]
        if "diffusion_model" in cfg:
            argv += ["--diffusion-model", str(cfg["diffusion_model"])]
        else:
            argv += ["-m", spec.model]
        if "vae" in cfg:
            argv += ["--vae", str(cfg["vae"])]
        argv += ["--listen-ip", host, "--listen-port", str(port)]
        if "threads" in cfg:
            argv += ["-t", str(cfg["threads"])]
        return argv + list(cfg.get("extra_args", []))

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return ("images/generations", "images/edits")

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        return estimate.scaled_file(spec.model, 1.5, 0.0, "file size")
