"""Text to speech at OpenAI's /v1/audio/speech.

Backends:
- ``espeak``: the espeak-ng synthesiser (Debian's ``espeak-ng``); no model files at all.
- ``kokoro``: Kokoro through ``kokoro-onnx``; ``--model`` is the .onnx file and the
  ``voices`` option the voices file.

Run: ``python -m deployments.engines.tts_server --model espeak-ng --config '{"backend": "espeak"}'``
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import subprocess
import wave
from typing import Any, Protocol

from aiohttp import web

from deployments.engines.common import (
    engine_app,
    error,
    json_body,
    run_engine,
)

FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
# A voice is a name (en, en-us, en+f3, af_heart), never a path or an option.
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+-]{0,63}")
MAX_INPUT_CHARS = 4096  # OpenAI's limit for one speech request


class Backend(Protocol):
    default_voice: str

    def synthesise(self, text: str, voice: str, speed: float) -> tuple[bytes, int]:
        """16-bit mono PCM samples and their rate."""
        ...


class EspeakBackend:
    default_voice = "en"

    def __init__(self) -> None:
        binary = shutil.which("espeak-ng")
        if binary is None:
            raise SystemExit("tts: espeak-ng is not installed (apt-get install espeak-ng)")
        self.binary = binary

    def synthesise(self, text: str, voice: str, speed: float) -> tuple[bytes, int]:
        words_per_minute = str(int(175 * speed))
        # The caller's text goes on stdin, never on the command line: as an argument, a text
        # such as "-f/etc/shadow" is an option (speak that file).
        done = subprocess.run(
            [self.binary, "-v", voice, "-s", words_per_minute, "--stdout", "--stdin"],
            input=text.encode(),
            capture_output=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0 or not done.stdout:
            raise ValueError(done.stderr.decode(errors="replace").strip() or "espeak-ng failed")
        with wave.open(io.BytesIO(done.stdout)) as wav:
            return wav.readframes(wav.getnframes()), wav.getframerate()


class KokoroBackend:
    default_voice = "af_heart"

    def __init__(self, model: str, voices: str) -> None:
        from kokoro_onnx import Kokoro  # noqa: PLC0415 - optional: only the Kokoro backend

        self.kokoro = Kokoro(model, voices)

    def synthesise(self, text: str, voice: str, speed: float) -> tuple[bytes, int]:
        import numpy as np  # noqa: PLC0415 - only the Kokoro backend needs it

        samples, rate = self.kokoro.create(text, voice=voice, speed=speed)
        pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        return pcm, int(rate)


def make_backend(model: str, config: dict[str, Any]) -> Backend:
    backend = config.get("backend") or ("kokoro" if model.endswith(".onnx") else "espeak")
    if backend == "espeak":
        return EspeakBackend()
    if backend == "kokoro":
        return KokoroBackend(model, str(config.get("voices", "voices.bin")))
    raise SystemExit(f"tts: unknown backend {backend!r} (espeak, kokoro)")


def as_wav(pcm: bytes, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return out.getvalue()


def make_app(backend: Backend, served_names: list[str], config: dict[str, Any]) -> web.Application:
    # One synthesis at a time: both backends are CPU-bound and not re-entrant.
    lock = asyncio.Lock()
    voices = config.get("voices_allowed")

    async def speech(request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            return error(400, "'input' must be a non-empty string.", "invalid_input")
        if len(text) > MAX_INPUT_CHARS:
            return error(400, f"'input' is over {MAX_INPUT_CHARS} characters.", "input_too_long")
        fmt = body.get("response_format", "wav")
        if fmt not in FORMATS:
            supported = ", ".join(FORMATS)
            return error(
                400,
                f"response_format {fmt!r} is not supported ({supported}).",
                "unsupported_format",
            )
        voice = str(body.get("voice") or config.get("voice") or backend.default_voice)
        if not VOICE_NAME.fullmatch(voice):
            return error(400, f"voice {voice[:64]!r} is not a voice name.", "invalid_voice")
        if voices and voice not in voices:
            return error(400, f"voice {voice!r} is not offered.", "invalid_voice")
        try:
            speed = float(body.get("speed", 1.0))
        except (TypeError, ValueError):
            return error(400, "'speed' must be a number.", "invalid_speed")
        if not 0.25 <= speed <= 4.0:
            return error(400, "'speed' must be between 0.25 and 4.0.", "invalid_speed")
        async with lock:
            try:
                pcm, rate = await asyncio.to_thread(backend.synthesise, text, voice, speed)
            except ValueError as exc:
                return error(400, str(exc), "synthesis_failed")
        data = as_wav(pcm, rate) if fmt == "wav" else pcm
        return web.Response(body=data, content_type=FORMATS[fmt])

    return engine_app(served_names, [web.post("/v1/audio/speech", speech)])


if __name__ == "__main__":
    run_engine(
        "tts-engine",
        lambda model, config, names: make_app(make_backend(model, config), names, config),
    )
