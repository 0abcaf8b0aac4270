"""faster-whisper: Whisper on CTranslate2 for a model folder in its format, served by
Modelship's own server (deployments/engines/faster_whisper_server.py) in the faster-whisper
engine environment, with the whisper.cpp engine's routes and formats."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

from deployments import estimate
from deployments.engines.ct2_whisper_folder import problems
from deployments.loaders.shipped import ShippedEngineLoader

if TYPE_CHECKING:
    from deployments.loaders.base import EngineSpec

DEVICES = ("auto", "cpu", "cuda")


class FasterWhisperLoader(ShippedEngineLoader):
    name = "faster_whisper"
    config_key = "faster_whisper_config"
    config_options: ClassVar[dict[str, str]] = {
        "device": "auto (CUDA where there is one), cpu or cuda",
        "compute_type": "CTranslate2's: default, int8, int8_float16, float16, float32…",
        "threads": "CPU threads (default: CTranslate2's choice)",
        "beam_size": "beam search width, 1 to 16 (default 5)",
        "language": "the audio's language (ISO 639-1) when a request names none",
    }
    usecases = frozenset({"transcription", "translation"})
    module = "deployments.engines.faster_whisper_server"

    def validate(self, spec: EngineSpec) -> list[str]:
        found = super().validate(spec)
        device = spec.config.get("device", "auto")
        if device not in DEVICES:
            found.append(f"{self.config_key}: device {device!r} is not one of {DEVICES}")
        beam = spec.config.get("beam_size", 5)
        if not isinstance(beam, int) or isinstance(beam, bool) or not 1 <= beam <= 16:
            found.append(f"{self.config_key}: beam_size is 1 to 16")
        if os.path.exists(spec.model):
            found += [f"model: {issue}" for issue in problems(spec.model)]
        return found

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        return "faster-whisper"

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        return ("audio/transcriptions", "audio/translations")

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        # Weights as float32 on CPU.
        return estimate.scaled_file(spec.model, 1.5, 0.0, "the folder's size")
