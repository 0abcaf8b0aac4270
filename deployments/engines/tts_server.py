"""Text to speech at OpenAI's /v1/audio/speech, on espeak-ng, Piper or Kokoro
(deployments/engines/tts_backends.py), in OpenAI's formats (deployments/engines/audio_out.py),
streamed as it is synthesised: the audio itself, or with `stream_format: sse` OpenAI's
`speech.audio.delta` events (base64 pieces) and a `speech.audio.done`.

Voices: OpenAI's names (`alloy`, `echo`, … and the newer `ash`, `ballad`, `coral`, `sage`,
`verse`, `marin`, `cedar`) map to the backend's own voices through the deployment's
`voice_map` over a default table (every name to the default voice where the backend has one
voice); the backend's own names are accepted as they are. `{"id": name}` is a voice too.

Run: ``python -m deployments.engines.tts_server --model espeak-ng --config '{"backend": "espeak"}'``
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from deployments.engines import audio_out
from deployments.engines.common import engine_app, error, json_body, run_engine
from deployments.engines.tts_backends import Backend, EspeakBackend, make_backend

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
# espeak-ng's variants for OpenAI's names: a spread of its English voices.
ESPEAK_MAP = dict(
    zip(
        OPENAI_VOICES,
        (
            "en-us",
            "en-us+m2",
            "en-gb+m3",
            "en-us+f2",
            "en-us+m3",
            "en-gb",
            "en-us+m7",
            "en-us+f3",
            "en-us+f4",
            "en-us+f1",
            "en-us+m4",
            "en-us+f5",
            "en-us+m5",
        ),
        strict=True,
    )
)
# A voice is a name (en, en-us, en+f3, af_heart), never a path or an option.
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+-]{0,63}")
MAX_INPUT_CHARS = 4096  # OpenAI's limit for one speech request


class Voices:
    """What a request's voice names: OpenAI's names through the deployment's map, the
    backend's own names as they are, restricted to `voices_allowed` where it is set."""

    def __init__(self, backend: Backend, config: dict[str, Any]) -> None:
        default = str(config.get("voice") or backend.voices[0])
        table = ESPEAK_MAP if isinstance(backend, EspeakBackend) else same_named(backend.voices)
        self.map = {name: table.get(name, default) for name in OPENAI_VOICES}
        self.map.update({str(k): str(v) for k, v in (config.get("voice_map") or {}).items()})
        self.map.update({name: name for name in backend.voices})
        self.default = default
        self.allowed = config.get("voices_allowed")
        self.accepted = [v for v in self.map if not self.allowed or v in self.allowed]
        # espeak-ng takes any of its many languages and variants (en+f3, fr, de+m2): a
        # well-formed name goes to it, and it says whether it knows it.
        self.open = isinstance(backend, EspeakBackend)

    def resolve(self, asked: Any) -> str:
        """The backend's voice for the request's; ValueError naming what is accepted."""
        if isinstance(asked, dict):
            asked = asked.get("id")
        if asked is None:
            return self.default
        name = str(asked)
        if name in self.accepted:
            return self.map[name]
        if self.open and VOICE_NAME.fullmatch(name) and not self.allowed:
            return name
        raise ValueError(
            f"voice {name[:64]!r} is not offered here; voices: {', '.join(self.accepted)}."
        )


def same_named(voices: list[str]) -> dict[str, str]:
    """OpenAI's voice names to a backend's voices named after them, as Kokoro's af_alloy,
    am_echo, bm_fable: the closest voice it has."""
    return {
        name: voice
        for voice in reversed(voices)  # the first of several wins
        for name in OPENAI_VOICES
        if voice.rpartition("_")[2] == name
    }


def make_app(backend: Backend, served_names: list[str], config: dict[str, Any]) -> web.Application:
    return engine_app(served_names, speech_routes(backend, config))


def speech_routes(backend: Backend, config: dict[str, Any]) -> list[web.RouteDef]:
    """/v1/audio/speech on a backend (a plugin's too: deployments/engines/plugin_server.py)."""
    # One synthesis at a time: the backends are CPU-bound and not re-entrant.
    lock = asyncio.Lock()
    voices = Voices(backend, config)

    async def speech(request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            return error(400, "'input' must be a non-empty string.", "invalid_input")
        if len(text) > MAX_INPUT_CHARS:
            return error(400, f"'input' is over {MAX_INPUT_CHARS} characters.", "input_too_long")
        fmt = body.get("response_format") or audio_out.default_format()
        if fmt not in audio_out.formats():
            supported = ", ".join(audio_out.formats())
            return error(
                400,
                f"response_format {fmt!r} is not supported here ({supported}).",
                "unsupported_format",
            )
        try:
            voice = voices.resolve(body.get("voice"))
        except ValueError as exc:
            return error(400, str(exc), "invalid_voice")
        try:
            speed = float(body.get("speed", 1.0))
        except (TypeError, ValueError):
            return error(400, "'speed' must be a number.", "invalid_speed")
        if not 0.25 <= speed <= 4.0:
            return error(400, "'speed' must be between 0.25 and 4.0.", "invalid_speed")
        stream_format = body.get("stream_format") or "audio"
        if stream_format not in ("audio", "sse"):
            return error(400, "'stream_format' is audio or sse.", "invalid_request")
        async with lock:
            chunks = in_thread(backend.stream(text, voice, speed))
            try:
                first = await anext(chunks)  # a failure before any audio is a plain 400
            except (ValueError, StopAsyncIteration) as exc:
                return error(400, str(exc) or "nothing was synthesised", "synthesis_failed")
            sse = stream_format == "sse"
            content_type = "text/event-stream" if sse else audio_out.CONTENT_TYPES[fmt]
            answer = web.StreamResponse(headers={"content-type": content_type})
            answer.enable_chunked_encoding()
            await answer.prepare(request)
            pieces = 0
            async for piece in audio_out.encoded(fmt, backend.rate, prepend(first, chunks)):
                pieces += 1
                await answer.write(audio_event(piece) if sse else piece)
            if sse:
                await answer.write(done_event(text, pieces))
            await answer.write_eof()
            return answer

    return [web.post("/v1/audio/speech", speech)]


def audio_event(piece: bytes) -> bytes:
    """`stream_format: sse`: a piece of the audio, base64, as OpenAI's event."""
    event = {"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()}
    return f"data: {json.dumps(event)}\n\n".encode()


def done_event(text: str, pieces: int) -> bytes:
    """The last event: usage as words in and audio pieces out (no tokenizer here)."""
    words = len(text.split())
    usage = {"input_tokens": words, "output_tokens": pieces, "total_tokens": words + pieces}
    return f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()


async def in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A synthesiser's chunks, each made in a worker thread (the loop keeps serving)."""
    done = object()
    while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
        assert isinstance(chunk, bytes)
        yield chunk


async def prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


if __name__ == "__main__":
    run_engine(
        "tts-engine",
        lambda model, config, names: make_app(make_backend(model, config), names, config),
    )
