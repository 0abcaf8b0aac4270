"""An example Modelship plugin (see plugins/README.md): text to speech as a tone per word (its
pitch from the word's letters, its length from the word's), embeddings of character
trigrams, and images as stripes (their colours from the prompt and the seed; an edit paints
them where the mask is white). Dependencies of its own (numpy, pillow), installed into its
own engine environment."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from deployments.engines.plugin_api import BasePlugin

if TYPE_CHECKING:
    from collections.abc import Iterator


class TonePlugin(BasePlugin):
    sample_rate = 16000
    voices = ("low", "high")

    def __init__(self, model: str, options: dict[str, Any]) -> None:
        super().__init__(model, options)
        self.dimensions = int(options.get("dimensions", 32))
        if not 2 <= self.dimensions <= 4096:
            raise SystemExit("tone: 'dimensions' is 2 to 4096")

    def create_speech(self, text: str, voice: str, speed: float) -> Iterator[bytes]:
        base = 220.0 if voice == "low" else 440.0
        for word in text.split():
            seconds = (0.08 + 0.04 * len(word)) / speed
            t = np.arange(int(seconds * self.sample_rate)) / self.sample_rate
            pitch = base * (1 + (sum(map(ord, word)) % 12) / 12)
            wave = 0.3 * np.sin(2 * np.pi * pitch * t)
            yield (wave * 32767).astype("<i2").tobytes()

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
        from PIL import Image  # noqa: PLC0415 - only images need it

        made = []
        for index in range(n):
            key = f"{prompt}\0{seed}\0{index}".encode()
            palette = np.frombuffer(hashlib.sha256(key).digest(), dtype=np.uint8)[:24]
            colours = palette.reshape(8, 3)
            stripes = colours[(np.arange(width) * 8 // width)]
            picture = Image.fromarray(np.broadcast_to(stripes, (height, width, 3)).copy())
            if image is not None:
                area = mask if mask is not None else Image.new("L", (width, height), 255)
                picture = Image.composite(picture, image, area)
            made.append(picture)
        return made

    def create_embedding(self, texts: list[str]) -> list[list[float]]:
        vectors = []
        for text in texts:
            vector = np.zeros(self.dimensions)
            padded = f"  {text.lower()} "
            for i in range(len(padded) - 2):
                digest = hashlib.sha256(padded[i : i + 3].encode()).digest()
                vector[int.from_bytes(digest[:4], "little") % self.dimensions] += 1.0
            norm = float(np.linalg.norm(vector)) or 1.0
            vectors.append([float(x) / norm for x in vector])
        return vectors
