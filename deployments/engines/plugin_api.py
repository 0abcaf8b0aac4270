"""What a Modelship plugin implements: a Python package with its own dependencies, installed
into its own engine environment, whose class (named by its `modelship.plugins` entry point)
subclasses BasePlugin and overrides the methods of what it does. Each returns raw outputs;
Modelship's plugin server (deployments/engines/plugin_server.py) turns them into OpenAI's
shapes, formats and errors, streams speech and refuses bad input before a plugin sees it.

A method that raises ValueError answers 400 with its words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np


class BasePlugin:
    """Subclass it, override what the plugin does, name the class in an entry point:

    [project.entry-points."modelship.plugins"]
    tone = "modelship_tone:TonePlugin"
    """

    # Speech: 16-bit mono PCM at this rate, and the plugin's own voice names (the first is
    # the default; OpenAI's names map to it unless the deployment's voice_map says otherwise).
    sample_rate: int = 24000
    voices: tuple[str, ...] = ("default",)

    def __init__(self, model: str, options: dict[str, Any]) -> None:
        """`model` is the deployment's model field, `options` its custom_config options."""
        self.model = model
        self.options = options

    def create_speech(self, text: str, voice: str, speed: float) -> Iterable[bytes]:
        """PCM chunks, as they are made (each is sent on at once)."""
        raise NotImplementedError

    def create_transcription(
        self, audio: np.ndarray, language: str | None, prompt: str | None, translate: bool
    ) -> tuple[str, list[tuple[float, float, str]]]:
        """16 kHz mono float32 audio in: the language, and (start s, end s, text) segments."""
        raise NotImplementedError

    def create_embedding(self, texts: list[str]) -> list[list[float]]:
        """One vector per text."""
        raise NotImplementedError

    # Images: the size of "auto", and what widths and heights must be multiples of.
    image_size: int = 512
    image_size_step: int = 8

    def create_image(
        self,
        prompt: str,
        width: int,
        height: int,
        n: int,
        seed: int | None,
        image: Any = None,
        mask: Any = None,
    ) -> list[Any]:
        """n PIL images (pillow is in every plugin's environment) of width x height; for an
        edit, `image` is the source (RGB) and `mask` the area to change (L), PIL images."""
        raise NotImplementedError


def implements(plugin: type[BasePlugin], method: str) -> bool:
    """Whether a plugin class overrides one of BasePlugin's methods."""
    return getattr(plugin, method) is not getattr(BasePlugin, method)
