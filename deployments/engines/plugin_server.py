"""The engine server of a plugin (`loader: custom`): it loads the plugin named by
`custom_config.plugin` from its `modelship.plugins` entry point, in the plugin's own engine
environment, and serves what the plugin implements in OpenAI's shapes, through the same
routes as the shipped engines: /v1/audio/speech (tts_server's voices, formats and
streaming), /v1/audio/transcriptions and /translations (whisper_server's decoding and
formats), /v1/embeddings, /v1/images/generations and /edits (diffusers_server's checks,
queue and metrics).

Run: ``python -m deployments.engines.plugin_server --model M --config '{"plugin": "tone"}'``
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import string
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web

from deployments.engines.common import engine_app, error, json_body, run_engine
from deployments.engines.diffusers_server import image_routes
from deployments.engines.plugin_api import BasePlugin, implements
from deployments.engines.transcript_formats import Segment
from deployments.engines.tts_server import speech_routes
from deployments.engines.whisper_server import transcription_routes

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator

    from deployments.engines.diffusers_server import Counters, Job

MAX_INPUTS = 2048  # OpenAI's limit for one embeddings request
# A plugin says which languages it knows by answering; any ISO 639-1 code may be asked.
LANGUAGES = {a + b for a, b in itertools.product(string.ascii_lowercase, repeat=2)}


def load(model: str, config: dict[str, Any]) -> BasePlugin:
    name = str(config.get("plugin", "")).strip().lower()
    found = {e.name.lower(): e for e in entry_points(group="modelship.plugins")}
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise SystemExit(f"plugin: no plugin {name!r} in this environment (found: {known})")
    plugin_class = found[name].load()
    if not (isinstance(plugin_class, type) and issubclass(plugin_class, BasePlugin)):
        raise SystemExit(f"plugin: {found[name].value} is not a BasePlugin subclass")
    options = config.get("options") or {}
    return plugin_class(model, dict(options))


class PluginVoice:
    """A plugin's speech as the TTS server's backend."""

    def __init__(self, plugin: BasePlugin) -> None:
        self.plugin = plugin
        self.rate = int(plugin.sample_rate)
        self.voices = list(plugin.voices)

    def stream(self, text: str, voice: str, speed: float) -> Iterator[bytes]:
        return iter(self.plugin.create_speech(text, voice, speed))


class PluginEars:
    """A plugin's transcription as the whisper server's transcriber."""

    languages = LANGUAGES

    def __init__(self, plugin: BasePlugin) -> None:
        self.plugin = plugin

    def run(
        self, audio: np.ndarray, task: str, options: dict[str, Any], gone: threading.Event
    ) -> tuple[str, list[Segment]]:
        language, segments = self.plugin.create_transcription(
            audio, options.get("language"), options.get("prompt"), task == "translate"
        )
        return language, [Segment(start, end, text) for start, end, text in segments]


class PluginPainter:
    """A plugin's images as the image routes' painter."""

    def __init__(self, plugin: BasePlugin) -> None:
        self.plugin = plugin
        self.default_size = int(plugin.image_size)
        self.size_step = int(plugin.image_size_step)

    def run(self, job: Job, counters: Counters, gone: threading.Event) -> list[Any]:
        images = self.plugin.create_image(
            job.prompt, job.width, job.height, job.n, job.seed, job.source, job.mask
        )
        counters.steps += 1  # a plugin's image is one step, as far as Modelship can tell
        return [image.convert("RGB") for image in images]


def embedding_routes(plugin: BasePlugin, served_names: list[str]) -> list[web.RouteDef]:
    lock = asyncio.Lock()

    async def embeddings(request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return error(400, "'input' must be a string or a list of strings.", "invalid_input")
        if len(texts) > MAX_INPUTS:
            return error(400, f"'input' has over {MAX_INPUTS} texts.", "invalid_input")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            return error(400, "'encoding_format' is float or base64.", "invalid_request")
        async with lock:
            try:
                vectors = await asyncio.to_thread(plugin.create_embedding, texts)
            except ValueError as exc:
                return error(400, str(exc), "invalid_input")
        data = []
        for index, vector in enumerate(vectors):
            values: Any = [float(x) for x in vector]
            if encoding == "base64":
                values = base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": values})
        tokens = sum(len(text.split()) for text in texts)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model") or served_names[0],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    return [web.post("/v1/embeddings", embeddings)]


def build(model: str, config: dict[str, Any], served_names: list[str]) -> web.Application:
    plugin = load(model, config)
    kind = type(plugin)
    routes: list[web.RouteDef] = []
    if implements(kind, "create_speech"):
        routes += speech_routes(PluginVoice(plugin), config)
    if implements(kind, "create_transcription"):
        routes += transcription_routes(PluginEars(plugin))
    if implements(kind, "create_embedding"):
        routes += embedding_routes(plugin, served_names)
    if implements(kind, "create_image"):
        routes += image_routes(PluginPainter(plugin))
    if not routes:
        raise SystemExit(f"plugin: {kind.__name__} implements none of BasePlugin's methods")
    return engine_app(served_names, routes, client_max_size=64 * 2**20)


if __name__ == "__main__":
    run_engine("plugin-engine", build)
