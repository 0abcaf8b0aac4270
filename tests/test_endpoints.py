"""The endpoint registry (openai_api/endpoints.py) agrees with the loaders and the routers
that read it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from deployments.loaders import LOADERS, EngineSpec
from ondemand import health_probe
from openai_api.auth import current_key
from openai_api.catalog import Key, Route
from openai_api.endpoints import ENDPOINTS, ONDEMAND, PUBLIC, notice_eligible
from openai_api.engine_dialect import chat_body
from openai_api.engine_error_codes import normalized, openai_code
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


def test_it_says_a_forced_function_as_llama_cpp_reads_it_and_as_is_elsewhere() -> None:
    roll = {"type": "function", "function": {"name": "roll"}}
    flip = {"type": "function", "function": {"name": "flip"}}
    body: dict[str, Any] = {
        "tools": [roll, flip],
        "tool_choice": {"type": "function", "function": {"name": "flip"}},
    }
    llama = replace(ROUTE, loader="llama_server", names_forced_tool=False)
    assert chat_body(llama, body) == {"tools": [flip], "tool_choice": "required"}
    assert chat_body(ROUTE, body) is body  # vLLM's and the simulated engine's read it as is
    assert chat_body(llama, {**body, "tool_choice": "auto"})["tool_choice"] == "auto"
    with pytest.raises(GatewayError) as refused:
        chat_body(llama, {**body, "tool_choice": {"type": "function", "function": {"name": "x"}}})
    assert (refused.value.status, refused.value.param) == (400, "tool_choice")
    # Allowed tools, as chat nests them and as the Responses API has them flat.
    nested: dict[str, Any] = {
        "mode": "auto",
        "tools": [{"type": "function", "function": {"name": "roll"}}],
    }
    flat: dict[str, Any] = {"mode": "required", "tools": [{"type": "function", "name": "roll"}]}
    choices: list[tuple[dict[str, Any], str]] = [
        ({"allowed_tools": nested}, "auto"),
        (flat, "required"),
    ]
    for choice, word in choices:
        allowed = {**body, "tool_choice": {"type": "allowed_tools", **choice}}
        assert chat_body(llama, allowed) == {"tools": [roll], "tool_choice": word}
        assert chat_body(ROUTE, allowed) is allowed
    for wrong in (
        {"type": "allowed_tools", "mode": "none", "tools": []},
        {"type": "allowed_tools", "mode": "auto", "tools": [{"name": ["roll"]}]},
        {"type": "function", "function": {"name": {"x": 1}}},
    ):
        with pytest.raises(GatewayError) as refused:
            chat_body(llama, {**body, "tool_choice": wrong})
        assert (refused.value.status, refused.value.param) == (400, "tool_choice")
    other = {**body, "tool_choice": {"type": "custom", "name": "x"}}
    assert chat_body(llama, other) is other  # not ours to say: the engine answers it


@pytest.mark.parametrize(
    ("status", "error", "code"),
    [
        (400, {"code": 400, "type": "exceed_context_size_error"}, "context_length_exceeded"),
        (
            400,
            {"code": 400, "message": "This model's maximum context length is 8"},
            "context_length_exceeded",
        ),
        (400, {"code": 400, "type": "invalid_request_error"}, "invalid_request"),
        (400, {"code": "400"}, "invalid_request"),
        (404, {"code": 404}, "not_found"),
        (500, {"code": 500, "type": "server_error"}, "engine_error"),
        (400, {"code": "invalid_value"}, "invalid_value"),  # a word stays
        (400, {"type": "invalid_request_error"}, None),  # no code stays none
    ],
)
def test_it_makes_an_engines_numeric_error_code_a_word(
    status: int, error: dict[str, Any], code: str | None
) -> None:
    assert openai_code(status, error) == code
    rewritten = normalized(status, json.dumps({"error": error}).encode())
    if isinstance(error.get("code"), int) or str(error.get("code", "")).isdigit():
        assert rewritten is not None and json.loads(rewritten)["error"]["code"] == code
    else:
        assert rewritten is None


def test_it_sends_the_requests_class_to_an_engine_that_schedules_by_it_never_the_callers() -> None:
    """vLLM started with `scheduling_policy: priority` orders what it holds by each request's
    `priority` (a lower number first): it gets the key's class plus the deployment's. A
    caller's own `priority` reaches no engine (it would jump the site's classes)."""
    asked: dict[str, Any] = {"messages": [], "priority": -100}
    assert "priority" not in chat_body(ROUTE, asked)
    vllm = replace(ROUTE, loader="vllm", engine_priority=True, priority=10)
    assert chat_body(vllm, asked)["priority"] == -10  # no key: the deployment's class alone
    low = Key(1, "batch", "p1", "", False, frozenset(), None, -20, None)
    token = current_key.set(low)
    try:
        assert chat_body(vllm, asked)["priority"] == 10  # class 10 - 20: after the class-0 ones
    finally:
        current_key.reset(token)
    loader = LOADERS["vllm"]
    scheduled = EngineSpec(name="m", model="org/m", config={"scheduling_policy": "priority"})
    assert loader.schedules_by_priority(scheduled)
    assert not loader.schedules_by_priority(EngineSpec(name="m", model="org/m"))
    assert not LOADERS["llama_server"].schedules_by_priority(scheduled)  # first come, first served
