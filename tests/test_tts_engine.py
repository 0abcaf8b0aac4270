"""The shipped TTS engine, on espeak-ng, run by the tts loader like any engine."""

from __future__ import annotations

import io
import wave
from typing import Any

import httpx
import pytest

from deployments import deployer
from deployments.models import State
from tests.conftest import as_gateway

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def speech_url(make_deployment: Any) -> str:
    deployment = make_deployment(
        "voice", loader="tts", usecase="tts", model="espeak-ng", config={"backend": "espeak"}
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    return str(deployment.engine_url) + "/v1/audio/speech"


def post(url: str, **options: Any) -> httpx.Response:
    """Straight to the engine, with its secret, as the gateway calls it."""
    return httpx.post(url, auth=as_gateway, **options)


def wav_seconds(data: bytes) -> float:
    """A (streamed) WAV's length: its frames read to the end (its header says "unknown")."""
    with wave.open(io.BytesIO(data)) as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        frames = len(wav.readframes(2**31)) // 2
        return frames / wav.getframerate()


def test_it_speaks_text_as_wav_and_pcm(speech_url: str) -> None:
    answer = post(
        speech_url,
        json={"model": "voice", "input": "Hello from Modelship.", "response_format": "wav"},
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "audio/wav"
    seconds = wav_seconds(answer.content)
    assert 0.5 < seconds < 10
    slow = post(
        speech_url,
        json={
            "model": "voice",
            "input": "Hello from Modelship.",
            "speed": 0.5,
            "response_format": "pcm",
        },
    )
    assert slow.headers["content-type"] == "audio/pcm"
    assert len(slow.content) > len(answer.content)  # half the speed, more samples


def test_it_answers_bad_requests_with_openai_errors(speech_url: str) -> None:
    for body, code in (
        ({"input": ""}, "invalid_input"),
        ({"input": "x" * 5000}, "input_too_long"),
        ({"input": "hi", "response_format": "ogg"}, "unsupported_format"),
        ({"input": "hi", "speed": 9}, "invalid_speed"),
    ):
        answer = post(speech_url, json=body)
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == code
    broken = post(speech_url, content=b"{not json", headers={"content-type": "application/json"})
    assert broken.json()["error"]["code"] == "invalid_json"


def test_it_speaks_a_text_that_looks_like_an_option_instead_of_reading_a_file(
    speech_url: str, tmp_path: Any
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the password is swordfish. " * 60)  # about a minute read aloud
    answer = post(
        speech_url,
        json={"model": "voice", "input": f"-f{secret}", "response_format": "wav"},
        timeout=60,
    )
    assert answer.status_code == 200
    seconds = wav_seconds(answer.content)
    # The path itself is spoken (a few seconds), not the file's minute of text.
    assert seconds < 15


def test_it_refuses_a_voice_that_is_not_a_name(speech_url: str) -> None:
    for voice in ("-f/etc/passwd", "../../etc/passwd", "en us", "x" * 80):
        answer = post(speech_url, json={"model": "voice", "input": "hi", "voice": voice})
        assert answer.status_code == 400, voice
        assert answer.json()["error"]["code"] == "invalid_voice"
