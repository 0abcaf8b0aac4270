"""The memory a deployment's engine will hold, estimated from its model's own metadata
(deployments/estimate.py): the formulas on real headers, shown beside memory_gib in /api and
the admin with a warning where the declared figure is below, used where memory_gib is
empty, and compared with what real llama.cpp holds."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from deployments import estimate
from deployments.loaders import EngineSpec, get_loader
from deployments.loaders.vllm import DEFAULT_SEQUENCES
from deployments.memory import estimate_of, estimate_report, need_gib
from deployments.tiny_model import Shape
from deployments.tiny_model import write as write_tiny
from deployments.validation import cross_field_problems
from modelship_cli.render import estimate_text
from tests.conftest import resident_bytes

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

GIB = 2**30


def hf_folder(folder: Path, config: dict[str, Any], tensors: dict[str, list[int]]) -> Path:
    """A Hugging Face model folder: config.json and one safetensors file of float16 zeros."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in tensors.items():
        size = 2
        for n in shape:
            size *= n
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.write(b"\0" * offset)
    return folder


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}


def test_it_reads_the_cache_a_gguf_context_takes_from_its_header(
    make_deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    shape = Shape(n_embd=128, n_layer=6, n_head=8)
    model = write_tiny(tmp_path / "m.gguf", shape=shape)
    deployment = make_deployment(
        "m", loader="llama_server", model=str(model), memory_gib=None, config={"n_ctx": 8192}
    )
    found = estimate_of(deployment)
    assert found is not None and found.basis == "GGUF header"
    # K and V, 6 layers x 8 KV heads x 16 (128 / 8) x 2 bytes, for 8,192 tokens.
    assert found.cache_gib * GIB == 2 * 6 * 8 * 16 * 2 * 8192
    assert found.weights_gib * GIB == model.stat().st_size
    assert found.overhead_gib == pytest.approx(0.05 + 0.1 * found.weights_gib)
    assert need_gib(deployment) == pytest.approx(found.gib, abs=1e-3)  # empty memory_gib
    on_gpu = estimate_of(make_deployment("g", loader="llama_server", model=str(model), num_gpus=1))
    assert on_gpu is not None and on_gpu.overhead_gib == pytest.approx(
        0.35 + 0.1 * on_gpu.weights_gib
    )


def test_it_reads_a_hugging_face_folder_for_vllm_and_takes_it_without_a_memory_figure(
    make_deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    folder = hf_folder(
        tmp_path / "llama",
        LLAMA_CONFIG,
        {"embed": [1000, 256], "layers.0.q": [256, 256], "layers.0.kv": [256, 128]},
    )
    deployment = make_deployment(
        "v",
        loader="vllm",
        model=str(folder),
        memory_gib=None,
        config={"max_model_len": 2048, "kv_cache_dtype": "fp8"},
    )
    found = estimate_of(deployment)
    assert found is not None and found.basis == "config.json and safetensors"
    weights = (1000 * 256 + 256 * 256 + 256 * 128) * 2
    assert found.weights_gib * GIB == pytest.approx(weights, rel=0.01)  # the header too
    # Its CPU build here: the 4 GiB of KV space it is given with no memory_gib, and its
    # three processes.
    assert (found.cache_gib, found.overhead_gib) == (
        4.0,
        pytest.approx(1.8 + 0.1 * found.weights_gib),
    )
    # On a GPU: one whole sequence of 2,048 tokens, 4 layers x 2 KV heads x (32 + 32) x 1
    # byte (fp8), and 1 GiB.
    gpu = estimate.vllm(str(folder), 2048, fp8=True)
    assert gpu is not None and gpu.cache_gib * GIB == 4 * 2 * 64 * 1 * 2048
    assert gpu.overhead_gib == pytest.approx(1.0 + 0.1 * gpu.weights_gib)
    values = {"name": "v", "model": str(folder), "loader": "vllm", "usecase": "generate"}
    assert "num_gpus" not in cross_field_problems(values)  # the estimate stands in
    hub = {**values, "model": "Qwen/Qwen3-8B"}
    assert "num_gpus" in cross_field_problems(hub)  # a hub id: nothing to read before it runs


def test_it_gives_an_undeclared_vllm_cache_for_several_sequences_and_counts_what_fits(
    make_deployment: Callable[..., Deployment], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = hf_folder(
        tmp_path / "llama",
        LLAMA_CONFIG,
        {"embed": [1000, 256], "layers.0.q": [256, 256], "layers.0.kv": [256, 128]},
    )
    gpu = estimate.vllm(str(folder), 2048, fp8=False)
    assert gpu is not None and gpu.sequence_gib == gpu.cache_gib  # one sequence of 2,048
    loader = get_loader("vllm")
    # On a GPU (vLLM's CUDA build): the estimate of one sequence is the floor; an undeclared
    # engine is given DEFAULT_SEQUENCES of them (or its max_num_seqs), the fit counted so.
    spec = EngineSpec(name="v", model=str(folder), config={"max_model_len": 2048})
    with monkeypatch.context() as gpu_host:  # the family a host whose NVML sees a GPU runs
        gpu_host.setattr("deployments.loaders.vllm.host_family", lambda: "vllm")
        on_gpu(loader, spec, gpu)
    # Here, vLLM's CPU build: its KV space (half of memory_gib: 2 GiB) in sequences, in the report
    # the API, the admin and `modelship describe` show.
    small = make_deployment(
        "v", loader="vllm", model=str(folder), memory_gib=4, config={"max_model_len": 2048}
    )
    report = estimate_report(small)
    assert report is not None
    per_sequence = 4 * 2 * 64 * 2 * 2048 / GIB
    assert report["sequences_fit"] == int(2 / per_sequence) and report["sequences_wanted"] == 8
    assert report["warning"] is None  # 2 GiB of cache holds hundreds of these
    long = make_deployment(
        "w", loader="vllm", model=str(folder), memory_gib=4, config={"max_model_len": 2**20}
    )
    warned = estimate_report(long)
    assert warned is not None and warned["sequences_fit"] == 2  # 1 GiB each
    assert warned["warning"].startswith(
        f"{warned['sequences_fit']} full-length sequences of KV cache fit"
    )
    assert "full-length sequences fit" in estimate_text(warned)


def on_gpu(loader: Any, spec: EngineSpec, gpu: estimate.Estimate) -> None:
    given = loader.estimate_memory_gib(spec)
    assert given == pytest.approx(gpu.gib + (DEFAULT_SEQUENCES - 1) * gpu.sequence_gib, abs=2e-3)
    assert loader.sequences_fit(spec, given) == (DEFAULT_SEQUENCES, DEFAULT_SEQUENCES)
    wide = replace(spec, config={**spec.config, "max_num_seqs": 32})
    assert loader.sequences_fit(wide, gpu.gib) == (1, 32)  # the floor holds one
    assert loader.estimate_memory_gib(wide) == pytest.approx(
        gpu.gib + 31 * gpu.sequence_gib, abs=2e-3
    )


@pytest.fixture
def root_api(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-1234567"))
    return client


def test_it_shows_the_estimate_beside_memory_gib_and_warns_below_it(
    root_api: APIClient, tmp_path: Path, client: Any
) -> None:
    model = write_tiny(tmp_path / "m.gguf", shape=Shape(n_layer=8, n_embd=256, n_head=8))
    body = {"name": "m", "model": str(model), "loader": "llama_server", "config": {"n_ctx": 32768}}
    low = root_api.post("/api/deployments/", {**body, "memory_gib": 0.01}, format="json").json()
    estimate = low["memory_estimate"]
    assert estimate["basis"] == "GGUF header"
    assert estimate["gib"] == pytest.approx(
        estimate["weights_gib"] + estimate["cache_gib"] + estimate["overhead_gib"], abs=2e-3
    )
    assert estimate["cache_gib"] == 2 * 8 * 8 * 32 * 2 * 32768 / GIB  # 1 GiB
    assert estimate["warning"].startswith(
        f"memory_gib 0.01 is below the estimate of {estimate['gib']:g}"
    )
    fine = root_api.patch(f"/api/deployments/{low['id']}/", {"memory_gib": 4}, format="json")
    assert fine.json()["memory_estimate"]["warning"] is None
    hub = root_api.post(
        "/api/deployments/",
        {"name": "h", "model": "org/model", "loader": "llama_server", "memory_gib": 1},
        format="json",
    ).json()
    assert hub["memory_estimate"] is None  # nothing on this host to read
    client.force_login(User.objects.get(username="root"))
    root_api.patch(f"/api/deployments/{low['id']}/", {"memory_gib": 0.01}, format="json")
    page = client.get(f"/admin/deployments/deployment/{low['id']}/change/").content.decode()
    assert "Memory estimate" in page and "from GGUF header" in page
    assert "is below the estimate" in page


@pytest.mark.usefixtures("engines")
def test_it_estimates_what_real_llama_cpp_holds(
    serving: Callable[..., Deployment],
    tmp_path: Path,
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    """The tiny model on llama.cpp: a cache of 2 layers x 4 heads x 16, the launcher's
    interpreter and llama.cpp's buffers; within the overhead's fixed part of what it holds
    once it has answered (SmolLM2's, within 10 %, in tests/test_example_model.py)."""
    model = write_tiny(tmp_path / "tiny.gguf")
    tiny = serving(
        "tiny",
        model=str(model),
        loader="llama_server",
        memory_gib=None,
        config={"n_ctx": 2048, "threads": 1},
    )
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {api_key()}"},
        timeout=60,
    )
    assert answer.status_code == 200
    found = estimate_of(tiny)
    assert found is not None
    held = resident_bytes(tiny.runtime_handle["replicas"][0]["pid"]) / GIB
    assert abs(found.gib - held) < 0.05, (found, held)  # 50 MiB: the fixed overhead's size
