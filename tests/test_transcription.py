"""Transcription and translation through /v1 with the official SDK, on whisper.cpp
(pywhispercpp, in the whisper engine environment the first start installs) with a tiny ggml
Whisper made here (`make_tiny_model --kind whisper`), and on faster-whisper (CTranslate2, in
its own environment) with the same model's CTranslate2 folder (`--kind whisper-ct2`): every
response format, audio in any format ffmpeg reads (speech the TTS engine made), and the
failures: undecodable audio, a model file whisper.cpp would crash on, a folder faster-whisper
would fetch its tokenizer for."""

from __future__ import annotations

import io
import json
import struct
import warnings
import wave
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.core.management import call_command

from deployments import deployer
from deployments.engines.whisper_ggml import problems
from deployments.engines.whisper_server import from_wav
from deployments.loaders import EngineSpec, get_loader
from deployments.models import Deployment, State
from tests.conftest import scaled
from tests.tiny_models import made

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("whisper") / "tiny-whisper.bin"
    call_command("make_tiny_model", str(path), "--kind", "whisper", "--seed", "1")
    return path


@pytest.fixture(scope="module")
def tiny_whisper_ct2() -> Path:
    return made("whisper-ct2", seed=1, name="tiny-whisper-ct2")


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)


@pytest.fixture(params=["whispercpp", "faster_whisper"])
def ears(request: pytest.FixtureRequest, serving: Callable[..., Deployment]) -> Deployment:
    """A transcription deployment on each engine, as the SDK sees it: the same model name."""
    model = request.getfixturevalue(
        "tiny_whisper" if request.param == "whispercpp" else "tiny_whisper_ct2"
    )
    return serving("ears", loader=request.param, usecase="transcription", model=str(model))


@pytest.fixture
def speech(client: openai.OpenAI, serving: Callable[..., Deployment]) -> Callable[[str], bytes]:
    """Speech from the TTS engine (espeak-ng), in a format."""
    serving("voice", loader="tts", usecase="tts", model="espeak-ng")

    def make(fmt: str) -> bytes:
        return client.audio.speech.create(
            model="voice",
            voice="alloy",
            input="Modelship listens. It writes down what it hears.",
            response_format=fmt,  # type: ignore[arg-type]
        ).content

    return make


def test_it_transcribes_speech_in_every_response_format(
    client: openai.OpenAI, ears: Deployment, speech: Callable[[str], bytes]
) -> None:
    wav = ("speech.wav", speech("wav"), "audio/wav")
    plain = client.audio.transcriptions.create(model="ears", file=wav)
    assert isinstance(plain.text, str) and plain.text.strip()  # nonsense, but words
    text = client.audio.transcriptions.create(model="ears", file=wav, response_format="text")
    assert isinstance(text, str) and text.strip() == plain.text.strip()
    srt = client.audio.transcriptions.create(model="ears", file=wav, response_format="srt")
    assert srt.startswith("1\n00:00:") and " --> " in srt
    vtt = client.audio.transcriptions.create(model="ears", file=wav, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:") and " --> " in vtt
    verbose = client.audio.transcriptions.create(
        model="ears", file=wav, response_format="verbose_json", language="en", temperature=0.2
    )
    assert verbose.language == "english" and 2.0 < verbose.duration < 6.0
    assert verbose.segments and verbose.segments[0].start >= 0.0
    assert verbose.text.strip() == " ".join(s.text.strip() for s in verbose.segments).strip()


def test_it_reads_any_audio_ffmpeg_reads_and_translates(
    client: openai.OpenAI, ears: Deployment, speech: Callable[[str], bytes]
) -> None:
    for fmt in ("mp3", "opus", "flac"):
        answer = client.audio.transcriptions.create(
            model="ears", file=(f"speech.{fmt}", speech(fmt))
        )
        assert answer.text.strip(), fmt
    with warnings.catch_warnings():  # the SDK marks translations deprecated; they still work
        warnings.simplefilter("ignore", DeprecationWarning)
        translated = client.audio.translations.create(
            model="ears", file=("speech.wav", speech("wav")), response_format="verbose_json"
        )
    assert translated.text.strip() and translated.segments
    raw = translated.model_dump()
    assert raw.get("task") == "translate"


def test_it_refuses_bad_audio_and_options_with_the_decoders_words(
    client: openai.OpenAI, ears: Deployment, speech: Callable[[str], bytes]
) -> None:
    with pytest.raises(openai.BadRequestError) as corrupt:
        client.audio.transcriptions.create(model="ears", file=("x.wav", b"RIFF nonsense" * 50))
    assert "could not be decoded" in str(corrupt.value)
    wav = ("speech.wav", speech("wav"))
    with pytest.raises(openai.BadRequestError) as fmt:
        client.audio.transcriptions.create(
            model="ears",
            file=wav,
            response_format="docx",  # type: ignore[call-overload]
        )
    assert "json, text, srt, vtt, verbose_json" in str(fmt.value)
    with pytest.raises(openai.BadRequestError) as language:
        client.audio.transcriptions.create(model="ears", file=wav, language="klingon")
    assert "klingon" in str(language.value)
    with pytest.raises(openai.BadRequestError):
        client.audio.transcriptions.create(model="ears", file=wav, temperature=7)
    # The engine is still there after all of it.
    assert client.audio.transcriptions.create(model="ears", file=wav).text.strip()
    ears.refresh_from_db()
    assert ears.state == State.READY


def test_it_refuses_a_model_whisper_cpp_would_crash_on(
    make_deployment: Any, tiny_whisper: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.bin"
    data = bytearray(tiny_whisper.read_bytes())
    struct.pack_into("<i", data, 4 + 4 * 6, 128)  # n_text_state: 64 -> 128, the tensors say 64
    broken.write_bytes(bytes(data))
    found = problems(broken)
    assert any("decoder.token_embedding.weight" in issue for issue in found), found
    loader = get_loader("whispercpp")
    spec = EngineSpec("ears", str(broken), usecase="transcription")
    assert any("decoder" in issue for issue in loader.validate(spec))
    assert problems(tmp_path / "missing.bin") and problems(tiny_whisper) == []
    # Started anyway (the file changed after it was checked): the start fails in words.
    deployment = make_deployment(
        "ears", loader="whispercpp", usecase="transcription", model=str(broken)
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "cannot be loaded" in deployment.state_reason
    assert "decoder.token_embedding.weight" in deployment.state_reason


def test_it_refuses_a_folder_faster_whisper_cannot_load_offline(
    make_deployment: Any, tiny_whisper_ct2: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "no-tokenizer"
    copy.mkdir()
    for name in ("model.bin", "config.json", "vocabulary.json"):
        (copy / name).write_bytes((tiny_whisper_ct2 / name).read_bytes())
    loader = get_loader("faster_whisper")
    spec = EngineSpec("ears", str(copy), usecase="transcription", config={"beam_size": 0})
    found = loader.validate(spec)
    assert any("tokenizer.json is missing" in issue for issue in found), found
    assert any("beam_size" in issue for issue in found), found
    assert loader.validate(EngineSpec("ears", str(tiny_whisper_ct2), usecase="transcription")) == []
    # A model.bin that is not CTranslate2's: the start fails in the engine's words.
    (copy / "tokenizer.json").write_bytes((tiny_whisper_ct2 / "tokenizer.json").read_bytes())
    (copy / "model.bin").write_bytes(b"not a model" * 100)
    deployment = make_deployment(
        "ears", loader="faster_whisper", usecase="transcription", model=str(copy)
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "cannot be loaded" in deployment.state_reason


@pytest.mark.sample("audio")
def test_it_answers_the_gateways_audio_paths_for_a_whisper_deployment(
    gateway_url: str, api_key: Callable[..., str], ears: Deployment, speech: Callable[[str], bytes]
) -> None:
    headers = {"authorization": f"Bearer {api_key()}"}
    files = {"file": ("speech.wav", speech("wav"), "audio/wav")}
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        answer = httpx.post(
            gateway_url + path,
            headers=headers,
            data={"model": "ears"},
            files=files,
            timeout=scaled(60),  # a transcription on a busy machine: more than httpx's 5 s
        )
        assert answer.status_code == 200, answer.text
        assert isinstance(json.loads(answer.text)["text"], str)


def test_it_reads_wav_without_ffmpeg() -> None:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(22050)
        wav.writeframes(b"\x00\x10\x00\x10" * 22050)  # one second, both channels
    samples = from_wav(out.getvalue())
    assert abs(samples.size - 16000) <= 1 and abs(float(samples[100]) - 0.125) < 1e-6
    with pytest.raises(ValueError, match="only WAV"):
        from_wav(b"ID3 an mp3")
