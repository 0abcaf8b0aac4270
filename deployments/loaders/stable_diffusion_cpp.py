"""stable-diffusion.cpp's `sd-server`, serving OpenAI image generation from a GGUF model."""

from __future__ import annotations

from deployments.loaders.base import EngineSpec, Loader, file_size_gib


class StableDiffusionCppLoader(Loader):
    name = "stable_diffusion_cpp"
    config_key = "stable_diffusion_cpp_config"
    config_options = frozenset({"threads", "binary", "extra_args", "diffusion_model", "vae"})
    usecases = frozenset({"image"})
    health_path = "/"
    binary_name = "sd-server"
    binary_env = "MSHIP_SD_SERVER_BIN"

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        cfg = spec.config
        argv = [self.binary(spec, container)]
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

    def estimate_memory_gib(self, spec: EngineSpec) -> float | None:
        size = file_size_gib(spec.model)
        return None if size is None else round(size * 1.5, 3)
