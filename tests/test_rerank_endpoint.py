"""/v1/rerank reaches a llama.cpp engine only when it was started for reranking: any other
embedding server answers 501 ("start it with --reranking"), which the gateway used to pass on;
it is a 404 unsupported_endpoint at the gateway, decided from the loader's endpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.core.management import call_command

from deployments.loaders import get_loader
from deployments.loaders.base import EngineSpec

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

RERANK = {"model": "tiny-embed", "query": "a fox", "documents": ["a red fox", "the sea"]}


def spec(usecase: str, **config: Any) -> EngineSpec:
    return EngineSpec(name="m", model="/m.gguf", usecase=usecase, config=config)


@pytest.mark.parametrize(
    ("usecase", "config", "served"),
    [
        ("embed", {}, False),
        ("embed", {"pooling": "mean"}, False),
        ("embed", {"pooling": "rank"}, True),
        ("embed", {"extra_args": ["--reranking"]}, True),
        ("embed", {"extra_args": ["--rerank"]}, True),
        ("embed", {"extra_args": ["--pooling", "rank"]}, True),
        ("embed", {"extra_args": ["--pooling=rank"]}, True),
        ("embed", {"pooling": "rank", "extra_args": ["--pooling", "cls"]}, False),  # last wins
        ("generate", {"extra_args": ["--reranking"]}, False),
    ],
)
def test_it_lists_rerank_only_for_an_engine_started_for_it(
    usecase: str, config: dict[str, Any], served: bool
) -> None:
    endpoints = get_loader("llama_server").endpoints(spec(usecase, **config))
    assert ("rerank" in endpoints) is served
    assert ("embeddings" in endpoints) is (usecase == "embed")


@pytest.mark.usefixtures("engines")
def test_it_answers_404_unsupported_endpoint_for_rerank_on_an_embedding_engine(
    tmp_path: Path,
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    model = tmp_path / "tiny-embed.gguf"
    call_command("make_tiny_model", str(model), "--embedding")
    serving(
        "tiny-embed",
        model=str(model),
        loader="llama_server",
        usecase="embed",
        memory_gib=0.5,
        config={"n_ctx": 2048},
    )
    headers = {"authorization": f"Bearer {api_key()}"}
    for path in ("/v1/rerank", "/rerank"):
        answer = httpx.post(gateway_url + path, json=RERANK, headers=headers, timeout=60)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "unsupported_endpoint"
    embedded = httpx.post(
        gateway_url + "/v1/embeddings",
        json={"model": "tiny-embed", "input": "a red fox"},
        headers=headers,
        timeout=60,
    )
    assert embedded.status_code == 200  # the engine itself serves what it was started for
