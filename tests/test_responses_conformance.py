"""The Responses API against the Open Responses specification's schema (what a strict
client checks), for plain, streamed, incomplete and function-calling answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.open_responses_schema import Conforming, check_event, check_response, sse_event

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")

TOOL = {
    "type": "function",
    "name": "roll",
    "description": "Roll a die",
    "parameters": {"type": "object", "properties": {}},
}


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway_url + "/v1",
        api_key=key,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(transport=Conforming()),
    )


def post(gateway_url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        gateway_url + "/v1/responses",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


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
            name, event = sse_event(block)
            if event is not None:
                assert event["type"] == name  # the SSE event's name is its type
                events.append(event)
    return events


def test_it_answers_every_field_the_specification_requires(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "one two three", "reasoning": "hmm"})
    key = api_key()
    plain = post(gateway_url, key, {"model": "sim", "input": "count"})
    assert plain.status_code == 200
    body = plain.json()
    check_response(body)
    # A sampling setting the request left out is echoed as the value the engine used.
    assert (body["temperature"], body["top_p"]) == (1.0, 1.0)
    assert (body["presence_penalty"], body["frequency_penalty"], body["top_logprobs"]) == (0, 0, 0)
    assert body["service_tier"] == "default" and body["completed_at"] >= body["created_at"]

    asked = post(
        gateway_url,
        key,
        {
            "model": "sim",
            "input": "count",
            "temperature": 0.2,
            "presence_penalty": 0.5,
            "safety_identifier": "user-42",
            "prompt_cache_key": "k1",
            "max_tool_calls": 3,
        },
    ).json()
    check_response(asked)
    assert (asked["temperature"], asked["presence_penalty"]) == (0.2, 0.5)
    assert (asked["safety_identifier"], asked["prompt_cache_key"]) == ("user-42", "k1")
    assert asked["max_tool_calls"] == 3

    events = streamed(gateway_url, key, {"model": "sim", "input": "count"})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        check_event(event)
    assert events[-1]["type"] == "response.completed"


def test_it_marks_the_items_of_an_incomplete_response_incomplete(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "one two three four"})
    key = api_key()
    body = post(gateway_url, key, {"model": "sim", "input": "x", "max_output_tokens": 2}).json()
    check_response(body)
    assert body["status"] == "incomplete" and body["completed_at"] is None
    assert body["output"][-1]["status"] == "incomplete"
    events = streamed(gateway_url, key, {"model": "sim", "input": "x", "max_output_tokens": 2})
    for event in events:
        check_event(event)
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[-1]["item"]["status"] == "incomplete"


def test_it_echoes_function_tools_with_their_strictness(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"tool_call": True})
    key = api_key()
    tools = [TOOL, {**TOOL, "name": "strict_roll", "strict": True}]
    body = post(gateway_url, key, {"model": "sim", "input": "roll", "tools": tools}).json()
    check_response(body)
    assert [t["strict"] for t in body["tools"]] == [None, True]
    assert body["output"][-1]["type"] == "function_call"
    for event in streamed(gateway_url, key, {"model": "sim", "input": "roll", "tools": tools}):
        check_event(event)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_logprobs", 21),
        ("presence_penalty", "high"),
        ("service_tier", "fastest"),
        ("safety_identifier", 7),
    ],
)
def test_it_refuses_a_wrong_type_for_the_new_fields(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    field: str,
    value: Any,
) -> None:
    serving("sim")
    answer = post(gateway_url, api_key(), {"model": "sim", "input": "x", field: value})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == field


def test_it_refuses_an_answer_to_a_function_call_nobody_made(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("sim")
    body = {
        "model": "sim",
        "input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "4"}],
    }
    answer = post(gateway_url, api_key(), body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "input[0].call_id" and "call_nowhere" in error["message"]


def test_it_passes_an_engines_own_refusal_through(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    """An engine's 4xx before it answers (a context-length 400 from vLLM, say) keeps its
    status, message and code; upstream_error is only for an engine that cannot be reached."""
    serving("sim", config={"fail_status": 400})
    answer = post(gateway_url, api_key(), {"model": "sim", "input": "x"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["message"]) == (
        "engine_error",
        "The simulated engine failed as it was told to.",
    )


def test_it_counts_a_requests_input_tokens_with_the_engines_tokenizer(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "four words of reply"})
    serving("voice", loader="tts", usecase="tts", model="espeak-ng", config={"backend": "espeak"})
    client = sdk(gateway_url, api_key())
    counted = client.responses.input_tokens.count(
        model="sim", input="one two three", instructions="be brief"
    )
    assert (counted.object, counted.input_tokens) == ("response.input_tokens", 5)
    first = client.responses.create(model="sim", input="one two three")
    chained = client.responses.input_tokens.count(
        model="sim", input="and five", previous_response_id=first.id
    )
    assert chained.input_tokens == 3 + 4 + 2  # the earlier turn, its answer, the input
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(model="voice", input="hello")
    assert refused.value.code == "unsupported_endpoint"
