"""Engine loaders by name."""

from __future__ import annotations

from deployments.loaders.base import EngineSpec, Loader
from deployments.loaders.faster_whisper import FasterWhisperLoader
from deployments.loaders.llama_server import LlamaServerLoader
from deployments.loaders.shipped import (
    CustomLoader,
    DiffusersLoader,
    SimulatedLoader,
    TtsLoader,
)
from deployments.loaders.stable_diffusion_cpp import StableDiffusionCppLoader
from deployments.loaders.vllm import VllmLoader
from deployments.loaders.whispercpp import WhisperCppLoader

LOADERS: dict[str, Loader] = {
    loader.name: loader
    for loader in (
        VllmLoader(),
        LlamaServerLoader(),
        DiffusersLoader(),
        StableDiffusionCppLoader(),
        WhisperCppLoader(),
        FasterWhisperLoader(),
        TtsLoader(),
        CustomLoader(),
        SimulatedLoader(),
    )
}

# models.yaml block name -> loader name, e.g. llama_server_config -> llama_server.
CONFIG_KEYS: dict[str, str] = {loader.config_key: name for name, loader in LOADERS.items()}


def choices() -> list[tuple[str, str]]:
    """The Deployment.loader field's choices, read from this registry when a form or the
    API needs them: a new loader is one entry in LOADERS, with no migration."""
    return [(name, name) for name in LOADERS]


def get_loader(name: str) -> Loader:
    try:
        return LOADERS[name]
    except KeyError:
        raise KeyError(f"unknown loader {name!r}") from None


__all__ = ["CONFIG_KEYS", "LOADERS", "EngineSpec", "Loader", "choices", "get_loader"]
