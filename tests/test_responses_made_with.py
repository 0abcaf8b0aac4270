"""A Responses object reports the temperature, top_p and max_output_tokens it was made with
(the Open Responses specification's reading): the request's own, else its deployment's
defaults (what the engine is configured to use for a request that sets none), else the
limit the gateway knows; a response cut at its length never says null (issue 58)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments.loaders import LOADERS, EngineSpec
from deployments.loaders.defaults import RequestDefaults
from openai_api.catalog import route_of
from openai_api.responses import protocol
from openai_api.responses.engine_events import EngineEvents
from openai_api.responses.translator import StreamTranslator
from tests.conftest import wait_until
from tests.open_responses_schema import check_event, check_response, sse_event

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

# `make run`'s chat, as the simulated engine plays it: the model card's sampling and an
# answer length of 1,024 for a request that names none (no pacing: 1,024 tokens at once).
CHAT_DEFAULTS = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 1024, "tokens_per_second": 0}
MADE_WITH = ("temperature", "top_p", "max_output_tokens")


def made_with(body: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(body[name] for name in MADE_WITH)


def post(gateway_url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(
        gateway_url + "/v1/responses",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    check_response(found)
    return found


def get(gateway_url: str, key: str, response_id: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{gateway_url}/v1/responses/{response_id}",
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def streamed(gateway_url: str, key: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream(
        "POST",
        gateway_url + "/v1/responses",
        json={**body, "stream": True},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        for block in answer.read().decode().split("\n\n"):
            _, event = sse_event(block)
            if event is not None:
                check_event(event)
                events.append(event)
    return events


def responses_in(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The response object each event that carries one carries, by the event's type."""
    return {e["type"]: e["response"] for e in events if "response" in e}


@pytest.mark.usefixtures("engines")
def test_it_reports_the_deployments_defaults_for_a_request_that_sets_none(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("chat", config=CHAT_DEFAULTS)
    key = api_key()
    body = post(gateway_url, key, {"model": "chat", "input": "hi"})
    assert made_with(body) == (0.2, 0.9, 1024)
    # It made 1,024 tokens and stopped there: the limit it says it was made with.
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 1024
    assert made_with(get(gateway_url, key, body["id"])) == (0.2, 0.9, 1024)

    events = streamed(gateway_url, key, {"model": "chat", "input": "hi"})
    found = responses_in(events)
    assert set(found) == {"response.created", "response.in_progress", "response.incomplete"}
    assert {made_with(response) for response in found.values()} == {(0.2, 0.9, 1024)}
    stored = get(gateway_url, key, found["response.incomplete"]["id"])
    assert made_with(stored) == (0.2, 0.9, 1024)


@pytest.mark.usefixtures("engines")
def test_it_reports_the_deployments_defaults_in_a_background_run(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("chat", config=CHAT_DEFAULTS)
    key = api_key()
    queued = post(gateway_url, key, {"model": "chat", "input": "hi", "background": True})
    assert queued["status"] == "queued" and made_with(queued) == (0.2, 0.9, 1024)
    finished: list[dict[str, Any]] = []

    def ended() -> bool:
        finished[:] = [get(gateway_url, key, queued["id"])]
        return finished[0]["status"] not in ("queued", "in_progress")

    wait_until(ended, 30)
    check_response(finished[0])
    assert finished[0]["status"] == "incomplete" and made_with(finished[0]) == (0.2, 0.9, 1024)


@pytest.mark.usefixtures("engines")
def test_it_reports_a_requests_own_settings(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("chat", config=CHAT_DEFAULTS)
    key = api_key()
    own = {"temperature": 0.7, "top_p": 0.5, "max_output_tokens": 3}
    body = post(gateway_url, key, {"model": "chat", "input": "hi", **own})
    assert made_with(body) == (0.7, 0.5, 3)
    assert body["usage"]["output_tokens"] == 3
    events = streamed(gateway_url, key, {"model": "chat", "input": "hi", **own})
    assert {made_with(r) for r in responses_in(events).values()} == {(0.7, 0.5, 3)}
    # Zero is a setting too, not "none set".
    cold = post(gateway_url, key, {"model": "chat", "input": "hi", "temperature": 0, "top_p": 1})
    assert (cold["temperature"], cold["top_p"]) == (0, 1)


@pytest.mark.usefixtures("engines")
def test_it_says_the_deployments_limit_that_cut_a_response(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    """No answer length set anywhere: the engine's own limit (its `max_output_tokens`, the
    route's output limit) cuts a long reply, and the response says so from its start."""
    serving("sim", config={"reply": "a b c d e f g h", "max_output_tokens": 5})
    key = api_key()
    body = post(gateway_url, key, {"model": "sim", "input": "hi"})
    assert body["status"] == "incomplete" and body["usage"]["output_tokens"] == 5
    assert body["max_output_tokens"] == 5
    assert (body["temperature"], body["top_p"]) == (1.0, 1.0)  # the engine's own
    events = streamed(gateway_url, key, {"model": "sim", "input": "hi"})
    found = responses_in(events)
    assert found["response.created"]["max_output_tokens"] == 5
    assert found["response.incomplete"]["max_output_tokens"] == 5


@pytest.mark.usefixtures("engines")
def test_it_reports_the_deployments_defaults_where_the_engine_answers_responses(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    """`responses: engine`: the same fields, whichever side answers."""
    serving("native", responses="engine", config=CHAT_DEFAULTS)
    key = api_key()
    body = post(gateway_url, key, {"model": "native", "input": "hi"})
    assert body["status"] == "incomplete" and made_with(body) == (0.2, 0.9, 1024)
    assert made_with(get(gateway_url, key, body["id"])) == (0.2, 0.9, 1024)


def cut_chunks(completion_tokens: int | None) -> list[dict[str, Any]]:
    """A chat completion stream that stops at its length, with or without usage."""
    chunk: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    chunks = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a b"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    ]
    if completion_tokens is not None:
        usage = {"prompt_tokens": 4, "completion_tokens": completion_tokens}
        chunks.append({**chunk, "choices": [], "usage": {**usage, "total_tokens": 4 + 7}})
    return chunks


@pytest.mark.parametrize(("counted", "says"), [(7, 7), (None, 32768)])
def test_it_says_the_limit_a_cut_response_reached_where_nobody_set_one(
    counted: int | None, says: int
) -> None:
    """Neither request nor deployment said a length, nor did the engine's configuration (a
    vLLM on its model's own context): cut, the response says the count its engine stopped
    at, else the site's limit for the deployment, never null."""
    request = protocol.parse({"model": "m", "input": "hi"})
    translator = StreamTranslator(protocol.envelope(request, "resp_1", int(time.time()), "x"))
    translator.ceiling = 32768
    assert translator.response["max_output_tokens"] is None
    events = translator.start()
    for chunk in cut_chunks(counted):
        events += translator.feed(json.loads(json.dumps(chunk)))
    events += translator.finish()
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["max_output_tokens"] == says
    check_event(final)


def test_it_says_the_limit_an_engines_cut_response_reached() -> None:
    request = protocol.parse({"model": "m", "input": "hi"})
    relay = EngineEvents(protocol.envelope(request, "resp_1", int(time.time()), "x"))
    relay.ceiling = 32768
    relay.relay(
        {
            "type": "response.incomplete",
            "response": {
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "max_output_tokens": None,
                "usage": {"input_tokens": 3, "output_tokens": 9},
                "output": [],
            },
        }
    )
    [final] = relay.finish()
    assert final["response"]["max_output_tokens"] == 9


def test_it_reads_llama_servers_flags_as_its_defaults(
    make_deployment: Callable[..., Deployment],
) -> None:
    """`make run`'s chat: llama-server given --n-predict, --temp and --top-p; without them,
    llama.cpp's own sampling (0.8, 0.95) and its context as the limit."""
    chat = make_deployment(
        "chat",
        loader="llama_server",
        model="var/models/chat.gguf",
        config={
            "n_ctx": 8192,
            "extra_args": ["--n-predict", "1024", "--temp", "0.2", "--top-p", "0.9"],
        },
    )
    assert route_of(chat).defaults == RequestDefaults(0.2, 0.9, 1024)
    plain = make_deployment("plain", loader="llama_server", model="var/models/chat.gguf")
    route = route_of(plain)
    assert route.defaults == RequestDefaults(0.8, 0.95, None)
    assert route.max_output_tokens == 4096
    llama = LOADERS["llama_server"]
    spelled = EngineSpec("x", "m.gguf", config={"extra_args": ["--temp=0.3", "-n", "-1"]})
    assert llama.request_defaults(spelled) == RequestDefaults(0.3, 0.95, None)


def test_it_reads_vllms_generation_config_as_its_defaults(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 512})
    )
    vllm = LOADERS["vllm"]
    own = EngineSpec("x", str(tmp_path))
    assert vllm.request_defaults(own) == RequestDefaults(0.6, 0.95, 512)
    overridden = EngineSpec(
        "x", str(tmp_path), config={"override_generation_config": {"temperature": 0.2}}
    )
    assert vllm.request_defaults(overridden) == RequestDefaults(0.2, 0.95, 512)
    assert (
        vllm.request_defaults(EngineSpec("x", str(tmp_path), config={"generation_config": "vllm"}))
        == RequestDefaults()
    )
    assert vllm.request_defaults(EngineSpec("x", "org/hub-model")) == RequestDefaults()
