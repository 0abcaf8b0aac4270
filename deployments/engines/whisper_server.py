"""Transcription and translation at OpenAI's /v1/audio/transcriptions and
/v1/audio/translations, on whisper.cpp through `pywhispercpp` (the whisper engine
environment's), for a ggml Whisper model.

Audio in any format ffmpeg reads (decoded to 16 kHz mono; on a host without ffmpeg, 16-bit
WAV). ffmpeg reads the upload from a pipe and may open no other protocol: an upload is the
caller's, and a playlist (HLS `#EXTM3U`, concat, SDP) would have ffmpeg fetch its URLs from
inside the engine's network. Undecodable audio is a 400 in the engine's own words; ffmpeg's
are logged for the operator, never sent back (they name what a playlist pointed at).
`response_format` json (the default), text, srt, vtt or verbose_json (segments with times,
the language, the duration); `language`, `prompt`, `temperature`. The model file is checked
before whisper.cpp loads it (deployments/engines/whisper_ggml.py): whisper.cpp aborts the process
on a wrong tensor size. One transcription at a time; a client that leaves stops whisper.cpp
at its next check.

Run: ``python -m deployments.engines.whisper_server --model var/models/tiny-whisper.bin``
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import shutil
import subprocess
import threading
import wave
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from deployments.engines.common import engine_app, error, run_engine
from deployments.engines.transcript_formats import FORMATS, Segment, render
from deployments.engines.whisper_ggml import problems

SAMPLE_RATE = 16000
MAX_TEMPERATURE = 1.0
# The upload comes in on stdin and the samples go out on stdout: no other protocol (file,
# http, tcp, udp, rtp...) is needed, so none is allowed to anything the input names.
PIPE_ONLY = ("-protocol_whitelist", "pipe")
UNDECODABLE = "the audio could not be decoded (not audio in a format this engine reads)"

log = logging.getLogger("modelship.engine.whisper")


def decode(data: bytes) -> np.ndarray:
    """Any audio ffmpeg reads (without ffmpeg: WAV), as 16 kHz mono float32; ValueError in
    the decoder's words."""
    samples = from_ffmpeg(data) if shutil.which("ffmpeg") else from_wav(data)
    if samples.size < SAMPLE_RATE // 10:
        raise ValueError("the audio is empty (under 0.1 s)")
    return samples


def from_wav(data: bytes) -> np.ndarray:
    """16-bit PCM WAV, mixed down and resampled (linearly) to 16 kHz."""
    try:
        with wave.open(io.BytesIO(data)) as wav:
            if wav.getsampwidth() != 2:
                raise ValueError("only 16-bit WAV can be read here (ffmpeg is not installed)")
            channels, rate = wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(2**31)
    except (wave.Error, EOFError) as exc:
        raise ValueError(
            f"the audio could not be decoded: {exc} (without ffmpeg only WAV can be read)"
        ) from exc
    pcm = np.frombuffer(frames[: len(frames) // (2 * channels) * 2 * channels], dtype="<i2")
    mono = pcm.reshape(-1, channels).mean(axis=1) / 32768.0
    positions = np.arange(0, mono.size, rate / SAMPLE_RATE)
    resampled: np.ndarray = np.interp(positions, np.arange(mono.size), mono)
    return resampled.astype(np.float32)


def from_ffmpeg(data: bytes) -> np.ndarray:
    done = subprocess.run(
        [
            *("ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin"),
            *(*PIPE_ONLY, "-i", "pipe:0"),
            *("-f", "f32le", "-ac", "1", "-ar", str(SAMPLE_RATE), "pipe:1"),
        ],
        input=data,
        capture_output=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        words = done.stderr.decode(errors="replace").strip()[-2000:] or "no reason given"
        log.warning("ffmpeg could not decode an upload: %s", words)
        raise ValueError(UNDECODABLE)
    return np.frombuffer(done.stdout, dtype="<f4")


class Whisper:
    def __init__(self, model: str, config: dict[str, Any]) -> None:
        issues = problems(model)
        if issues:
            raise SystemExit(f"whisper: {model} cannot be loaded: " + "; ".join(issues[:5]))
        from pywhispercpp.model import Model  # noqa: PLC0415 - the whisper environment's

        threads = int(config.get("threads") or 2)
        self.model = Model(model, redirect_whispercpp_logs_to=None, n_threads=threads)
        self.languages = set(self.model.available_languages())
        self.default_language = config.get("language")

    def run(
        self, audio: np.ndarray, task: str, options: dict[str, Any], gone: threading.Event
    ) -> tuple[str, list[Segment]]:
        language = options.get("language") or self.default_language
        if not language:
            (language, _), _ = self.model.auto_detect_language(audio)
        found = self.model.transcribe(
            audio,
            abort_callback=gone.is_set,
            language=language,
            translate=task == "translate",
            initial_prompt=options.get("prompt") or "",
            temperature=options.get("temperature", 0.0),
            print_progress=False,
            print_realtime=False,
        )
        segments = [Segment(s.t0 / 100, s.t1 / 100, str(s.text)) for s in found]
        return str(language), segments


class Transcriber(Protocol):
    languages: set[str]

    def run(
        self, audio: np.ndarray, task: str, options: dict[str, Any], gone: threading.Event
    ) -> tuple[str, list[Segment]]:
        """The language heard (or asked) and the segments, for "transcribe" or "translate"."""
        ...


def make_app(whisper: Transcriber, served_names: list[str]) -> web.Application:
    return engine_app(served_names, transcription_routes(whisper), client_max_size=64 * 2**20)


def transcription_routes(whisper: Transcriber) -> list[web.RouteDef]:
    """/v1/audio/transcriptions and /translations on a transcriber (a plugin's too)."""
    lock = asyncio.Lock()

    def handler(task: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            try:
                form = await request.post()
            except ValueError:
                return error(400, "The body must be multipart/form-data.", "invalid_request")
            upload = form.get("file")
            if not isinstance(upload, web.FileField):
                return error(400, "'file' (the audio) is required.", "missing_file")
            try:
                options = checked(form, whisper.languages, task)
                audio = await asyncio.to_thread(decode, upload.file.read())
            except ValueError as exc:
                return error(400, str(exc), "invalid_request")
            gone = threading.Event()
            async with lock:
                try:
                    language, segments = await asyncio.to_thread(
                        whisper.run, audio, task, options, gone
                    )
                except asyncio.CancelledError:
                    gone.set()  # the client left: whisper.cpp stops at its next check
                    raise
            duration = audio.size / SAMPLE_RATE
            body, content_type = render(
                options["response_format"], task, language, duration, segments
            )
            return web.Response(text=body, content_type=content_type)

        return handle

    return [
        web.post("/v1/audio/transcriptions", handler("transcribe")),
        web.post("/v1/audio/translations", handler("translate")),
    ]


def checked(form: Any, languages: set[str], task: str) -> dict[str, Any]:
    """The request's options; ValueError naming what is wrong and what is accepted."""
    fmt = str(form.get("response_format") or "json")
    if fmt not in FORMATS:
        raise ValueError(f"response_format {fmt!r} is not one of {', '.join(FORMATS)}.")
    options: dict[str, Any] = {"response_format": fmt}
    language = str(form.get("language") or "").strip().lower()
    if language:
        if task == "translate":
            raise ValueError("'language' is not taken by translations (the output is English).")
        if language not in languages:
            raise ValueError(f"language {language!r} is not one whisper knows (ISO 639-1 codes).")
        options["language"] = language
    prompt = form.get("prompt")
    if isinstance(prompt, str) and prompt:
        options["prompt"] = prompt
    if form.get("temperature") not in (None, ""):
        try:
            temperature = float(str(form["temperature"]))
        except ValueError as exc:
            raise ValueError("'temperature' must be a number.") from exc
        if not (0.0 <= temperature <= MAX_TEMPERATURE) or math.isnan(temperature):
            raise ValueError("'temperature' must be between 0 and 1.")
        options["temperature"] = temperature
    return options


def build(model: str, config: dict[str, Any], names: list[str]) -> web.Application:
    return make_app(Whisper(model, config), names)


if __name__ == "__main__":
    run_engine("whisper-engine", build)
