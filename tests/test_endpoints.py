"""The endpoint registry (openai_api/endpoints.py) agrees with the loaders and the routers
that read it."""

from __future__ import annotations

import json

import pytest

from deployments.loaders import LOADERS, EngineSpec
from ondemand import health_probe
from openai_api.catalog import Route
from openai_api.endpoints import ENDPOINTS, ONDEMAND, PUBLIC, notice_eligible
from openai_api.errors import GatewayError

ROUTE = Route(
    deployment_id=1,
    name="m",
    aliases=(),
    loader="simulated",
    usecase="generate",
    endpoints=frozenset(),
    state="stopped",
    on_demand=True,
    urls=(),
    created=0,
)


def test_it_knows_every_endpoint_a_loader_serves_and_for_which_use_case() -> None:
    for name, loader in LOADERS.items():
        for usecase in loader.usecases:
            spec = EngineSpec(name="m", model="m", usecase=usecase, aliases=(), config={})
            for path in loader.endpoints(spec):
                assert path in ENDPOINTS, f"{name} serves /v1/{path}, not in the registry"
                assert usecase in ENDPOINTS[path].usecases, (name, usecase, path)
    assert set(ENDPOINTS) == PUBLIC | ONDEMAND


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_it_answers_a_health_probe_where_the_registry_says(path: str) -> None:
    traits = ENDPOINTS[path]
    for streaming in (False, True):
        if not traits.probe:
            with pytest.raises(GatewayError) as refused:
                health_probe.answer(path, ROUTE, streaming)
            assert refused.value.code == "ondemand_health_unsupported"
            continue
        body, content_type = health_probe.answer(path, ROUTE, streaming)
        if streaming and traits.probe_streams:
            assert content_type == "text/event-stream" and body.endswith(b"data: [DONE]\n\n")
        else:
            assert content_type == "application/json" and json.loads(body)["model"] == "m"


def test_it_gives_the_queued_notice_only_where_the_registry_says() -> None:
    assert notice_eligible("chat/completions", streaming=True)
    assert notice_eligible("responses", streaming=False)
    assert not notice_eligible("responses", streaming=True)  # its events have no place for it
    assert not notice_eligible("embeddings", streaming=False)
    assert not notice_eligible("no/such/path", streaming=False)
