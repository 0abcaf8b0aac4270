"""Hostile and malformed input at /v1: every refusal is an OpenAI-shaped 4xx with the request
id, and anything unexpected is a JSON 500 (or an error event mid-stream), never an HTML page
or a traceback. Each case here was once answered with a 500."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.db import OperationalError

from deployments.runtimes.process import free_port
from ondemand.adapter import DjangoDeployer
from openai_api import gateway
from openai_api.responses.translator import StreamTranslator
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def gw(gateway_url: str, api_key: Callable[..., str], serving: Any) -> httpx.Client:
    serving("sim")
    serving("emb", usecase="embed")
    return httpx.Client(
        base_url=gateway_url, headers={"authorization": f"Bearer {api_key()}"}, timeout=30
    )


def openai_error(answer: httpx.Response, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.headers["x-request-id"]
    error: dict[str, Any] = answer.json()["error"]
    assert error["message"] and error["type"] and error["code"]
    return error


def nested(depth: int) -> bytes:
    return b'{"model": "sim", "x": ' + b"[" * depth + b"]" * depth + b"}"


def test_it_refuses_json_nested_too_deep_before_parsing_it(gw: httpx.Client) -> None:
    for depth in (65, 1000, 100_000):
        answer = gw.post(
            "/v1/chat/completions",
            content=nested(depth),
            headers={"content-type": "application/json"},
        )
        assert openai_error(answer, 400)["code"] == "invalid_json"
    # Brackets inside strings are text, not nesting.
    body = {"model": "sim", "messages": [{"role": "user", "content": "[" * 5000}]}
    assert gw.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("stream", ["yes", "false", 1, {}])
def test_it_refuses_a_stream_flag_that_is_no_boolean(gw: httpx.Client, stream: Any) -> None:
    body = {"model": "sim", "messages": [{"role": "user", "content": "x"}], "stream": stream}
    error = openai_error(gw.post("/v1/chat/completions", json=body), 400)
    assert (error["code"], error["param"]) == ("invalid_type", "stream")
    # null is no stream, as OpenAI reads it.
    assert gw.post("/v1/chat/completions", json={**body, "stream": None}).status_code == 200


@pytest.mark.parametrize("after", ["--1", "²", "1e3", "9" * 40, " 1"])
def test_it_refuses_a_starting_after_that_is_no_sequence_number(
    gw: httpx.Client, after: str
) -> None:
    answer = gw.get("/v1/responses/resp_x", params={"stream": "true", "starting_after": after})
    assert openai_error(answer, 400)["param"] == "starting_after"


MODEL_PART = b'--b\r\nContent-Disposition: form-data; name="model"\r\n'


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data; boundary=b", b'{"model": "sim"}'),  # JSON sent as a form
        ("multipart/form-data", MODEL_PART + b"\r\nsim\r\n--b--\r\n"),  # no boundary
        (
            "multipart/form-data; boundary=b",
            MODEL_PART + b"Content-Type: text/plain; charset=x-unknown\r\n\r\nsim\r\n--b--\r\n",
        ),
        (
            "multipart/form-data; boundary=b",
            MODEL_PART
            + b"Content-Type: multipart/mixed; boundary=c\r\n\r\n--c\r\n\r\nsim\r\n--c--\r\n"
            + b"--b--\r\n",
        ),
    ],
)
def test_it_refuses_a_form_it_cannot_read(gw: httpx.Client, content_type: str, body: bytes) -> None:
    answer = gw.post(
        "/v1/audio/transcriptions", content=body, headers={"content-type": content_type}
    )
    assert openai_error(answer, 400)["code"] in ("invalid_form", "missing_model")


def test_it_refuses_a_form_that_names_two_models(
    gw: httpx.Client, serving: Callable[..., Deployment]
) -> None:
    """The gateway would judge the first (a model the key may call) and the engine serve the
    last: a form gives each field once."""
    serving("other")
    body = (
        MODEL_PART + b"\r\nsim\r\n" + b"--b\r\n"
        b'Content-Disposition: form-data; name="model"\r\n\r\nother\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        + b"RIFF"
        + b"\0" * 40
        + b"\r\n--b--\r\n"
    )
    answer = gw.post(
        "/v1/audio/transcriptions",
        content=body,
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    error = openai_error(answer, 400)
    assert (error["code"], error["param"]) == ("invalid_form", "model")
    assert "more than once" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"text": {"format": 1.5}}, "text.format"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"reasoning": "high"}, "reasoning"),
        ({"input": [{"role": "user", "content": [7]}]}, "input[0].content"),
        ({"input": [{"type": "mcp_call"}]}, "input[0]"),
        ({"max_tool_calls": "x"}, "max_tool_calls"),
        ({"temperature": "hot"}, "temperature"),
        (
            {
                "tools": [
                    {
                        "type": "mcp",
                        "server_label": "x",
                        "server_url": "http://x",
                        "require_approval": 5,
                    }
                ]
            },
            "tools[0].require_approval",
        ),
        (
            {
                "tools": [
                    {
                        "type": "mcp",
                        "server_label": "x",
                        "server_url": "http://x",
                        "allowed_tools": "roll",
                    }
                ]
            },
            "tools[0].allowed_tools",
        ),
    ],
)
def test_it_names_the_field_of_a_responses_request_of_the_wrong_shape(
    gw: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    answer = gw.post("/v1/responses", json={"model": "sim", "input": "hi", **fields})
    assert openai_error(answer, 400)["param"] == param


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"max_tokens": [1]}),
        ("/v1/chat/completions", {"max_tokens": "x"}),
        ("/v1/chat/completions", {"tools": [[]]}),
        ("/v1/chat/completions", {"messages": [5]}),
        ("/v1/completions", {"prompt": 1.5}),
        ("/v1/embeddings", {"input": {"a": 1}}),
    ],
)
def test_it_has_the_simulated_engine_refuse_what_a_real_engine_refuses(
    gw: httpx.Client, path: str, fields: dict[str, Any]
) -> None:
    model = "emb" if path == "/v1/embeddings" else "sim"
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}
    openai_error(gw.post(path, json=body), 400)


def test_it_answers_an_unexpected_failure_with_a_json_500(
    gw: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug with a secret in it: sk-12345")

    monkeypatch.setattr(gateway, "requested_model", broken)
    answer = gw.post("/v1/chat/completions", json={"model": "sim"}, headers={"x-request-id": "r-1"})
    error = openai_error(answer, 500)
    assert error["code"] == "internal_error" and "r-1" in error["message"]
    assert "sk-12345" not in answer.text and "Traceback" not in answer.text


def test_it_ends_a_responses_stream_that_breaks_with_response_failed(
    gw: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:

    feed = StreamTranslator.feed
    fed: list[Any] = []

    def broken(self: Any, chunk: Any) -> Any:
        fed.append(chunk)
        if len(fed) > 2:  # after the answer began: the stream is under way
            raise RuntimeError("broken translator")
        return feed(self, chunk)

    monkeypatch.setattr(StreamTranslator, "feed", broken)
    body = {"model": "sim", "input": "hi", "stream": True, "store": False}
    with gw.stream("POST", "/v1/responses", json=body) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"  # the stream still ends as the specification says
    events = [json.loads(line[5:]) for line in lines[:-1]]
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "internal_error"


def test_it_names_the_deployment_not_the_engine_address_when_it_cannot_reach_it(
    gw: httpx.Client, make_deployment: Callable[..., Deployment]
) -> None:
    port = free_port("127.0.0.1")
    make_deployment("gone", state="ready", engine_urls=[f"http://127.0.0.1:{port}"])
    seen_by_gateway(lambda s: "gone" in s.routes and s.routes["gone"].state == "ready")
    body = {"model": "gone", "messages": [{"role": "user", "content": "hi"}]}
    error = openai_error(gw.post("/v1/chat/completions", json=body), 502)
    assert "gone" in error["message"] and str(port) not in error["message"]


def test_it_answers_503_when_the_control_plane_store_fails_during_an_on_demand_acquire(
    gw: httpx.Client, make_deployment: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:

    make_deployment("lazy", mode="on_demand")
    seen_by_gateway(lambda s: "lazy" in s.routes)

    async def down(self: Any, deployment_id: int) -> Any:
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(DjangoDeployer, "view", down)
    body = {"model": "lazy", "messages": [{"role": "user", "content": "hi"}]}
    error = openai_error(gw.post("/v1/chat/completions", json=body), 503)
    assert error["code"] == "ondemand_unavailable"
    assert "could not connect" not in error["message"]  # the cause stays in the log
