"""Plugins (`loader: custom`) with the official SDK: the example plugin under plugins/tone,
installed into its own engine environment by its first start, serving speech (through the
TTS server's voices, formats and streaming) and embeddings; and a plugin that cannot load."""

from __future__ import annotations

import base64
import io
import shutil
import wave
from typing import TYPE_CHECKING, Any

import numpy as np
import openai
import pytest
from PIL import Image

from deployments import deployer, engine_envs
from deployments.loaders import EngineSpec, get_loader
from deployments.models import Deployment, State

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)


def seconds_of(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as wav:
        return len(wav.readframes(2**31)) / 2 / wav.getframerate()


@pytest.mark.sample("audio")
def test_it_serves_a_plugins_speech_through_the_openai_voices_and_formats(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("tones", loader="custom", usecase="tts", model="tone", config={"plugin": "tone"})
    spoken = client.audio.speech.create(
        model="tones", voice="alloy", input="one three", response_format="wav"
    )
    # A tone a word: 0.08 s + 0.04 s a letter, at the plugin's 16 kHz.
    assert abs(seconds_of(spoken.content) - (0.20 + 0.28)) < 0.01
    high = client.audio.speech.create(
        model="tones", voice="high", input="one three", response_format="wav", speed=2.0
    )
    assert abs(seconds_of(high.content) - 0.24) < 0.01
    mp3 = client.audio.speech.create(model="tones", voice="alloy", input="in mp3").content
    assert mp3[:3] == b"ID3" or mp3[0] == 0xFF  # OpenAI's default format, through ffmpeg
    with pytest.raises(openai.BadRequestError) as unknown:
        client.audio.speech.create(model="tones", voice="baritone", input="hi")
    assert "low, high" in str(unknown.value)  # the plugin's own voices are listed


def test_it_serves_a_plugins_embeddings(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving(
        "tone-embed",
        loader="custom",
        usecase="embed",
        model="tone",
        config={"plugin": "tone", "options": {"dimensions": 16}},
    )
    # The SDK asks for base64 and decodes it; floats work too.
    vectors = client.embeddings.create(
        model="tone-embed", input=["the cat sat", "the cat sat down", "quantum flux"]
    ).data
    a, b, c = (np.array(v.embedding) for v in vectors)
    assert len(a) == 16 and abs(float(np.linalg.norm(a)) - 1.0) < 1e-5
    assert float(a @ b) > float(a @ c)  # shared trigrams, closer
    plain = client.embeddings.create(
        model="tone-embed", input="the cat sat", encoding_format="float"
    )
    assert np.allclose(plain.data[0].embedding, a, atol=1e-6)


@pytest.mark.sample("images")
def test_it_serves_a_plugins_images_through_the_image_routes(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("tone-paint", loader="custom", usecase="image", model="tone", config={"plugin": "tone"})
    made = client.images.generate(
        model="tone-paint", prompt="stripes", n=2, size="96x64", extra_body={"seed": 3}
    )
    first, second = (picture(item.b64_json) for item in made.data or [])
    assert first.size == (96, 64) and first.mode == "RGB"
    assert first.tobytes() != second.tobytes()  # each image of n is its own
    again = client.images.generate(
        model="tone-paint", prompt="stripes", size="96x64", extra_body={"seed": 3}
    )
    assert picture((again.data or [])[0].b64_json).tobytes() == first.tobytes()
    source = io.BytesIO()
    Image.new("RGB", (64, 64), (0, 0, 0)).save(source, format="PNG")
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (0, 0, 32, 64))  # the left half changes
    masked = io.BytesIO()
    mask.save(masked, format="PNG")
    edited = client.images.edit(
        model="tone-paint",
        image=("black.png", source.getvalue()),
        mask=("half.png", masked.getvalue()),
        prompt="stripes",
    )
    result = picture((edited.data or [])[0].b64_json)
    assert result.size == (64, 64) and result.getpixel((48, 10)) == (0, 0, 0)  # kept
    with pytest.raises(openai.BadRequestError) as size:
        client.images.generate(model="tone-paint", prompt="x", size="65x64")
    assert "multiples of 8" in str(size.value)  # the shared checks, before the plugin


def picture(b64: str | None) -> Image.Image:
    assert b64 is not None
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def test_it_refuses_a_plugin_it_cannot_have(make_deployment: Any) -> None:
    loader = get_loader("custom")
    assert loader.validate(EngineSpec("x", "m", usecase="tts", config={})) == [
        "custom_config: 'plugin' names the plugin (plugins/ or a package)"
    ]
    assert loader.validate(EngineSpec("x", "m", usecase="tts", config={"plugin": "../etc"})) == [
        "custom_config: '../etc' is not a plugin name (a folder under plugins/ or a package)"
    ]
    assert "plugin-tone" in engine_envs.families()
    # Options the plugin refuses fail the start with its words.
    bad = make_deployment(
        "tone-bad",
        loader="custom",
        usecase="embed",
        model="tone",
        config={"plugin": "tone", "options": {"dimensions": 1}},
    )
    deployer.restart(bad.pk)
    bad.refresh_from_db()
    assert bad.state == State.FAILED
    assert "'dimensions' is 2 to 4096" in bad.state_reason


def test_it_installs_an_edited_plugin_afresh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plugin = tmp_path / "plugins" / "echo"
    (plugin / "echo").mkdir(parents=True)
    (plugin / "pyproject.toml").write_text("[project]\nname = 'echo'\n")
    monkeypatch.setattr(engine_envs, "PLUGINS_DIR", tmp_path / "plugins")
    family = engine_envs.plugin_family("Echo")
    assert family == "plugin-echo" and family in engine_envs.families()
    assert str(plugin) in engine_envs.requirements(family)
    before = engine_envs.digest(family)
    (plugin / "build").mkdir()
    (plugin / "build" / "leftover.py").write_text("x = 1\n")  # what pip leaves: no change
    assert engine_envs.digest(family) == before
    (plugin / "echo" / "__init__.py").write_text("x = 2\n")
    edited = engine_envs.digest(family)
    assert edited != before
    # The same files in another clone (elsewhere on disk): the same environment.
    shutil.copytree(tmp_path / "plugins", tmp_path / "clone" / "plugins")
    monkeypatch.setattr(engine_envs, "PLUGINS_DIR", tmp_path / "clone" / "plugins")
    assert engine_envs.digest(family) == edited
    # Not a folder here: the distribution of that name, from the package index.
    assert engine_envs.requirements("plugin-elsewhere").splitlines()[-1] == "elsewhere"
