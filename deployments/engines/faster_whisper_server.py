"""Transcription and translation on faster-whisper (Whisper on CTranslate2, the faster-whisper
engine environment's), for a model folder in CTranslate2's format: the same OpenAI routes,
formats and checks as the whisper.cpp engine (deployments/engines/whisper_server.py).

The folder must hold model.bin, config.json and tokenizer.json: without the tokenizer
faster-whisper would fetch OpenAI's from the Hugging Face Hub, and Modelship never downloads
at start. Options (faster_whisper_config): device (cpu, cuda, auto), compute_type (default,
int8, float16, …), threads, beam_size, language. A client that leaves stops the
transcription between segments.

Run: ``python -m deployments.engines.faster_whisper_server --model var/models/tiny-whisper-ct2``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deployments.engines.common import run_engine
from deployments.engines.ct2_whisper_folder import problems
from deployments.engines.transcript_formats import Segment
from deployments.engines.whisper_server import make_app

if TYPE_CHECKING:
    import threading

    import numpy as np
    from aiohttp import web


class FasterWhisper:
    def __init__(self, model: str, config: dict[str, Any]) -> None:
        issues = problems(model)
        if issues:
            raise SystemExit(f"faster-whisper: {model} cannot be loaded: " + "; ".join(issues))
        from faster_whisper import WhisperModel  # noqa: PLC0415 - the engine environment's

        try:
            self.model = WhisperModel(
                model,
                device=str(config.get("device") or "auto"),
                compute_type=str(config.get("compute_type") or "default"),
                cpu_threads=int(config.get("threads") or 2),
                local_files_only=True,
            )
        except (RuntimeError, ValueError) as exc:
            raise SystemExit(f"faster-whisper: {model} cannot be loaded: {exc}") from exc
        self.languages = set(self.model.supported_languages)
        self.default_language = config.get("language")
        self.beam_size = int(config.get("beam_size") or 5)

    def run(
        self, audio: np.ndarray, task: str, options: dict[str, Any], gone: threading.Event
    ) -> tuple[str, list[Segment]]:
        found, info = self.model.transcribe(
            audio,
            task=task,
            language=options.get("language") or self.default_language,
            initial_prompt=options.get("prompt"),
            temperature=options.get("temperature", 0.0),
            beam_size=self.beam_size,
        )
        segments: list[Segment] = []
        for segment in found:  # decoded lazily, one 30 s window after another
            if gone.is_set():
                break
            segments.append(Segment(segment.start, segment.end, segment.text))
        return info.language, segments


def build(model: str, config: dict[str, Any], names: list[str]) -> web.Application:
    return make_app(FasterWhisper(model, config), names)


if __name__ == "__main__":
    run_engine("faster-whisper-engine", build)
