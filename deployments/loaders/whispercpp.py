"""whisper.cpp's `whisper-server`, serving transcriptions at the OpenAI path."""

from __future__ import annotations

from deployments.loaders.base import EngineSpec, Loader, file_size_gib


class WhisperCppLoader(Loader):
    name = "whispercpp"
    config_key = "whispercpp_config"
    config_options = frozenset({"threads", "language", "binary", "extra_args"})
    usecases = frozenset({"transcription"})
    default_image = "ghcr.io/ggml-org/whisper.cpp:main"
    binary_name = "whisper-server"
    binary_env = "MSHIP_WHISPER_SERVER_BIN"

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        cfg = spec.config
        argv = [self.binary(spec, container), "-m", spec.model, "--host", host, "--port", str(port)]
        # Serve at the OpenAI path so the gateway forwards it unchanged.
        argv += ["--inference-path", "/v1/audio/transcriptions", "--convert"]
        if "threads" in cfg:
            argv += ["-t", str(cfg["threads"])]
        if "language" in cfg:
            argv += ["-l", str(cfg["language"])]
        return argv + list(cfg.get("extra_args", []))

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return ("audio/transcriptions",)

    def estimate_memory_gib(self, spec: EngineSpec) -> float | None:
        size = file_size_gib(spec.model)
        return None if size is None else round(size * 1.3, 3)
