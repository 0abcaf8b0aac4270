"""The Responses API on /v1/responses, with the official openai SDK against the simulated
engine (which can emit reasoning and tool-call deltas): built from the engine's chat
completions, streamed as the Responses event protocol, stored in the gateway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from deployments.models import Deployment
from tests.gateway_support import api_key, gateway_url, serving

__all__ = ["api_key", "gateway_url", "serving"]  # fixtures

pytestmark = pytest.mark.usefixtures("engines")


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)


def last_chat_request(deployment: Deployment) -> dict[str, Any]:
    """What the engine was sent for the last turn."""
    deployment.refresh_from_db()
    body: dict[str, Any] = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    return body


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return sdk(gateway_url, api_key())


def test_it_answers_text_and_stores_it(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "Paris is the capital"})
    answer = client.responses.create(
        model="sim", input="Capital of France?", instructions="Be brief.", metadata={"k": "v"}
    )
    assert answer.id.startswith("resp_") and answer.status == "completed"
    assert answer.output_text == "Paris is the capital"
    [message] = answer.output
    assert message.type == "message" and message.role == "assistant"
    assert answer.usage is not None and answer.usage.output_tokens == 4
    assert answer.usage.total_tokens == answer.usage.input_tokens + 4
    assert (answer.instructions, answer.metadata) == ("Be brief.", {"k": "v"})
    again = client.responses.retrieve(answer.id)
    assert again.model_dump() == answer.model_dump()
    client.responses.delete(answer.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answer.id)


def test_it_streams_the_event_protocol_in_order(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "one two three", "reasoning": "let me think"})
    with client.responses.stream(model="sim", input="count") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    reasoning = "".join(
        e.delta for e in events if e.type == "response.reasoning_summary_text.delta"
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (reasoning.strip(), text) == ("let me think", "one two three")
    # Reasoning opened first (output 0), the message second; each closed once.
    added = [
        (e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"
    ]
    done = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.done"]
    assert added == done == [(0, "reasoning"), (1, "message")]
    assert final.output_text == "one two three"
    assert final.output[0].type == "reasoning"
    assert client.responses.retrieve(final.id).output_text == "one two three"


def test_it_round_trips_a_function_call_with_previous_response_id(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"tool_call": True, "reply": "It is sunny"})
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    first = client.responses.create(model="sim", input="Weather in Oslo?", tools=tools)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert last_chat_request(sim)["tools"][0]["function"]["name"] == "get_weather"
    second = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert second.output_text == "It is sunny"
    sent = last_chat_request(sim)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == call.call_id
    assert sent[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}


def test_it_chains_three_turns_and_branches_from_an_earlier_one(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"echo": True})
    one = client.responses.create(model="sim", input="first")
    two = client.responses.create(model="sim", input="second", previous_response_id=one.id)
    three = client.responses.create(model="sim", input="third", previous_response_id=two.id)
    assert three.output_text == "third" and three.previous_response_id == two.id
    sent = last_chat_request(sim)["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "first"),
        ("assistant", "first"),
        ("user", "second"),
        ("assistant", "second"),
        ("user", "third"),
    ]
    branch = client.responses.create(model="sim", input="other", previous_response_id=one.id)
    assert branch.output_text == "other"
    sent = last_chat_request(sim)["messages"]
    assert [m["content"] for m in sent] == ["first", "first", "other"]
    # The input items of the third turn: every input up to it, newest first by default.
    items = client.responses.input_items.list(three.id)
    assert texts(items.data) == ["third", "second", "second", "first", "first"]


def test_it_pages_input_items_both_ways(
    client: openai.OpenAI, serving: Callable[..., Deployment], gateway_url: str
) -> None:
    serving("sim")
    inputs: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    answer = client.responses.create(model="sim", input=inputs)
    page = client.responses.input_items.list(answer.id, order="asc", limit=2)
    assert texts(page.data) == ["m0", "m1"] and page.has_more
    assert page.model_extra and page.model_extra["last_id"] == page.data[-1].id
    every = client.responses.input_items.list(answer.id, order="asc", limit=2)
    assert texts(every) == ["m0", "m1", "m2", "m3", "m4"]  # the SDK follows `after` to the end
    newest = client.responses.input_items.list(answer.id, order="desc", limit=3)
    assert texts(newest.data) == ["m4", "m3", "m2"]
    rest = client.responses.input_items.list(answer.id, order="desc", after=newest.data[-1].id)
    assert texts(rest.data) == ["m1", "m0"] and not rest.has_more
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(answer.id, limit=101)


def test_it_keeps_each_callers_responses_to_itself(
    serving: Callable[..., Deployment], gateway_url: str, api_key: Callable[..., str]
) -> None:
    serving("sim")
    alice, bob = sdk(gateway_url, api_key("alice")), sdk(gateway_url, api_key("bob"))
    mine = alice.responses.create(model="sim", input="secret")
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="sim", input="x", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(mine.id)
    assert alice.responses.retrieve(mine.id).output_text


def test_it_says_incomplete_when_the_engine_stops_on_max_output_tokens(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim")
    answer = client.responses.create(model="sim", input="x", max_output_tokens=3)
    assert answer.status == "incomplete"
    assert answer.incomplete_details is not None
    assert answer.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(model="sim", input="x", max_output_tokens=3) as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"tools": [{"type": "web_search"}]}, "hosted tool"),
        ({"tools": [{"type": "mcp", "server_label": "x", "connector_id": "c"}]}, "connector"),
        ({"tool_choice": {"type": "mcp", "server_label": "x"}}, "MCP"),
        ({"background": True, "store": False}, "background"),
        ({"input": 5}, "input"),
        ({"previous_response_id": "resp_nope"}, None),
    ],
)
def test_it_refuses_what_it_cannot_serve_before_calling_the_engine(
    client: openai.OpenAI, serving: Callable[..., Deployment], extra: dict[str, Any], says: str
) -> None:
    sim = serving("sim")
    body: dict[str, Any] = {"model": "sim", "input": "x", **extra}
    with pytest.raises(openai.APIStatusError) as refused:
        client.post("/responses", body=body, cast_to=httpx.Response)
    if says is None:
        assert refused.value.status_code == 404
    else:
        assert refused.value.status_code == 400 and says in refused.value.message
    assert httpx.get(engine_url(sim) + "/sim/stats").json()["served"] == 0


def texts(items: Any) -> list[str]:
    """The text of each message item of a page (or of all pages, iterated)."""
    return [i.content[0].text for i in items if i.type == "message"]


def engine_url(deployment: Deployment) -> str:
    deployment.refresh_from_db()
    return deployment.engine_url


def test_it_answers_404_for_a_deployment_that_does_not_chat(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("vectors", usecase="embed")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="vectors", input="x")
