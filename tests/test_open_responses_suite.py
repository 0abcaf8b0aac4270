"""The public Open Responses compliance suite's seventeen scenarios, written here from the
specification and the suite's published list of tests (same intent, our own requests and
checks), against the simulated model `make run` serves as `sim-chat` (it calls a tool when
one is offered and takes images). Every response and event is checked against the Open
Responses schema; the feature files (test_responses_*.py) hold the finer behaviour."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema
import pytest
from openai.types.responses import ResponseOutputMessage

from tests.open_responses_schema import (
    COMPACTED,
    check_event,
    check_response,
    conforming_sdk,
    sse_event,
)
from tests.ws_support import final, until_done

if TYPE_CHECKING:
    from collections.abc import Callable

    import openai

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
MODEL = "sim-chat"
REPLY = "Hello there friend"
# A 32x32 PNG (a red heart on white), as the suite sends it: an image inline as a data: URL.
HEART = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAABmklEQVR42tyWAaTyUB"
    "zFew/eG4AHz+MBSAHKBiJRGFKwIgQQJKLUIioBIhCAiCAAEizAQIAECaASqFFJq84nudjnaqvuPnxzgP9xfrq5938c"
    "sPn7PwHTKSoViCIEAYEAMhmoKsU2mUCWEQqB5xEMIp/HaGQG2G6RSuH9HQ7H34rFrtPbdz4jl6PbwmEsl3QA1mt4vc"
    "RKk8dz9eg6IpF7tt9fzGY0gCgafFRFo5Blc5vLhf3eCOj1yNhM5GRMVK0aATxPZoz09YXjkQDmczJgquGQAPp9WwCN"
    "BgG027YACgUC6HRsAZRKBDAY2AJoNv/ZnwzA6WScznG3p4UAymXGAEkyXrTFAh8fLAGqagQAyGaZpYsi7bHTNPz8MEj/"
    "/LxuFPo+UBS8vb0KaLXubrRa7aX0RMLCykwmn0z3+XA4WACcTpCkh9MFAZpmuVXo+mO/w+/HZvNgbblcUCxaSo/Hyck"
    "80Yu6XXDcvfVZr79cvMZjuN2U9O9vKAqjZrfbIZ0mV4TUi9Xqz6jddNy//7+e3n8Fhf/Llo2kxi8AQyGRoDkmAhAAAA"
    "AASUVORK5CYII="
)
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "The city, e.g. Paris"}},
        "required": ["location"],
    },
}


@pytest.fixture
def sim_chat(serving: Callable[..., Deployment]) -> Deployment:
    """`make run`'s sim-chat: it calls an offered tool and takes images."""
    return serving(MODEL, config={"tool_call": True, "vision": True, "reply": REPLY})


@pytest.fixture
def key(api_key: Callable[..., str]) -> str:
    return api_key()


@pytest.fixture
def client(gateway_url: str, key: str) -> openai.OpenAI:
    return conforming_sdk(gateway_url, key)


def post(gateway_url: str, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{gateway_url}/v1{path}",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


def respond(gateway_url: str, key: str, input: Any, **body: Any) -> dict[str, Any]:
    """POST /v1/responses, as the suite sends it: raw JSON, a 200 whose body is a
    conforming, completed response with some output."""
    answer = post(gateway_url, key, "/responses", {"model": MODEL, "input": input, **body})
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()
    check_response(response)
    assert response["output"]
    return response


def completed(response: dict[str, Any]) -> dict[str, Any]:
    assert response["status"] == "completed", response
    return response


def engine_saw(deployment: Deployment) -> list[dict[str, Any]]:
    """The chat messages the engine was last sent."""
    deployment.refresh_from_db()
    body = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def message(role: str, content: Any, **fields: Any) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content, **fields}


def test_it_answers_a_basic_response(gateway_url: str, key: str, sim_chat: Deployment) -> None:
    # basic-response
    response = completed(
        respond(gateway_url, key, [message("user", "Say hello in exactly 3 words.")])
    )
    [item] = response["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == REPLY


def test_it_takes_assistant_history_with_phase_labels(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # assistant-phase
    history = [
        message("assistant", "I should answer with the saved number.", phase="commentary"),
        message("assistant", "The number is four.", phase="final_answer"),
        message("user", "Repeat only the number."),
    ]
    completed(respond(gateway_url, key, history))
    assert [(m["role"], m["content"]) for m in engine_saw(sim_chat)] == [
        ("assistant", "I should answer with the saved number."),
        ("assistant", "The number is four."),
        ("user", "Repeat only the number."),
    ]


def test_it_accepts_phase_labels_on_output_messages_in_the_response_schema() -> None:
    # response-output-phase-schema: a schema check alone (the suite sends no request): a
    # response whose assistant messages carry phases conforms, and the SDK keeps them.
    def said(phase: str, text: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return {
            **message("assistant", content, phase=phase),
            "id": f"msg_{phase}",
            "status": "completed",
        }

    response: dict[str, Any] = {
        "id": "resp_phases",
        "object": "response",
        "created_at": 1764967971,
        "completed_at": 1764967972,
        "status": "completed",
        "incomplete_details": None,
        "model": MODEL,
        "previous_response_id": None,
        "instructions": None,
        "output": [said("commentary", "Checking."), said("final_answer", "Four.")],
        "error": None,
        "tools": [],
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "top_p": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_logprobs": 0,
        "temperature": 1,
        "reasoning": {"effort": None, "summary": None},
        "usage": {
            "input_tokens": 1,
            "output_tokens": 2,
            "total_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "max_output_tokens": None,
        "max_tool_calls": None,
        "store": True,
        "background": False,
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": None,
        "prompt_cache_key": None,
    }
    check_response(response)
    parsed = [ResponseOutputMessage.model_validate(item) for item in response["output"]]
    assert [m.phase for m in parsed] == ["commentary", "final_answer"]


def test_it_streams_a_response_as_server_sent_events_ending_with_done(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # streaming-response
    body = {"model": MODEL, "input": [message("user", "Count from 1 to 5.")], "stream": True}
    with httpx.stream(
        "POST",
        gateway_url + "/v1/responses",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = answer.read().decode()
    blocks = [b for b in text.split("\n\n") if b.strip() and not b.startswith(":")]
    assert blocks[-1] == "data: [DONE]"
    events = []
    for block in blocks[:-1]:
        name, event = sse_event(block)
        assert event is not None, block
        assert name == event["type"], block
        check_event(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.completed"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == REPLY == completed(events[-1]["response"])["output"][0]["content"][0]["text"]


def test_it_answers_a_response_over_a_websocket(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-response
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input=[message("user", "Count from 1 to 3.")])  # type: ignore[list-item]
        events = until_done(connection)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    completed(final(events))


def test_it_answers_responses_one_after_another_on_one_websocket(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-sequential-responses
    with client.responses.connect() as connection:
        answers = []
        for word in ("first", "second"):
            connection.response.create(
                model=MODEL, store=False, input=f"Reply with exactly: {word}"
            )
            answers.append(final(until_done(connection)))
    assert [completed(a)["store"] for a in answers] == [False, False]
    assert answers[0]["id"] != answers[1]["id"]


def test_it_continues_an_unstored_response_on_the_same_websocket(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-continuation: only the new input goes up; the socket holds the rest.
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, store=False, input="Remember the code word: cobalt. Reply with OK."
        )
        first = final(until_done(connection))
        connection.response.create(
            model=MODEL,
            store=False,
            previous_response_id=first["id"],
            input="What is the code word? Reply with only the code word.",
        )
        second = completed(final(until_done(connection)))
    assert second["previous_response_id"] == first["id"]
    assert [m["content"] for m in engine_saw(sim_chat)] == [
        "Remember the code word: cobalt. Reply with OK.",
        REPLY,
        "What is the code word? Reply with only the code word.",
    ]


def not_found(events: list[dict[str, Any]], previous: str) -> None:
    """The one event of a turn that continues what the socket cannot find."""
    [error] = events
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    assert previous in error["error"]["message"]


def test_it_refuses_an_unstored_chain_after_a_reconnect_and_recovers_with_a_new_one(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-reconnect-store-false-recovery
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, store=False, input="Remember the code word: copper. Reply with OK."
        )
        first = final(until_done(connection))
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, store=False, previous_response_id=first["id"], input="Continue."
        )
        not_found(until_done(connection), first["id"])
        # The client starts over, the whole context in the input and no previous response.
        connection.response.create(
            model=MODEL,
            store=False,
            input=[message("user", "Start a new response and reply with exactly: recovered")],  # type: ignore[list-item]
        )
        recovered = completed(final(until_done(connection)))
    assert recovered["previous_response_id"] is None


def test_it_refuses_to_continue_an_unknown_previous_response_over_a_websocket(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-previous-response-not-found
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, store=False, previous_response_id="resp_never_made", input="Hello?"
        )
        not_found(until_done(connection), "resp_never_made")


def test_it_forgets_an_unstored_response_when_its_continuation_fails(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-failed-continuation-evicts-cache
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, store=False, input="Remember the code word: ember. Reply with OK."
        )
        first = final(until_done(connection))
        # A tool result for a call the previous response never made: the turn fails...
        connection.response.create(
            model=MODEL,
            store=False,
            previous_response_id=first["id"],
            input=[{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}],
        )
        [failed] = until_done(connection)
        # ... and the response it continued is gone from the socket.
        connection.response.create(
            model=MODEL, store=False, previous_response_id=first["id"], input="Continue."
        )
        not_found(until_done(connection), first["id"])
    assert failed["type"] == "error" and 400 <= failed["status"] < 600


def test_it_starts_a_new_websocket_chain_from_a_compacted_window(
    client: openai.OpenAI, sim_chat: Deployment
) -> None:
    # websocket-compact-new-chain
    conversation: Any = [
        message("user", [{"type": "input_text", "text": "The compaction code word is slate."}]),
        message("assistant", [{"type": "output_text", "text": "OK."}]),
        message("user", [{"type": "input_text", "text": "Compress this for later."}]),
    ]
    compacted = client.responses.compact(model=MODEL, input=conversation)
    window = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL,
            store=False,
            tools=[],
            input=[*window, message("user", "Continue. Reply with exactly: compacted")],  # type: ignore[list-item]
        )
        answered = completed(final(until_done(connection)))
    assert answered["previous_response_id"] is None
    assert engine_saw(sim_chat)[-1] == {
        "role": "user",
        "content": "Continue. Reply with exactly: compacted",
    }


def test_it_passes_a_system_message_to_the_model(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # system-prompt
    pirate = "You are a pirate. Always respond in pirate speak."
    completed(respond(gateway_url, key, [message("system", pirate), message("user", "Say hello.")]))
    assert [(m["role"], m["content"]) for m in engine_saw(sim_chat)] == [
        ("system", pirate),
        ("user", "Say hello."),
    ]


def test_it_answers_with_a_function_call_when_offered_a_tool(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # tool-calling
    question = [message("user", "What's the weather like in San Francisco?")]
    response = respond(gateway_url, key, question, tools=[WEATHER_TOOL])
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)
    assert response["tools"][0]["name"] == "get_weather"


def test_it_takes_an_image_in_the_user_content(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # image-input
    content = [
        {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
        {"type": "input_image", "image_url": HEART},
    ]
    completed(respond(gateway_url, key, [message("user", content)]))
    [sent] = engine_saw(sim_chat)
    assert [part["type"] for part in sent["content"]] == ["text", "image_url"]
    assert sent["content"][1]["image_url"]["url"] == HEART


def test_it_answers_from_the_conversation_history_in_the_input(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # multi-turn
    history = [
        message("user", "My name is Alice."),
        message("assistant", "Hello Alice! How can I help you today?"),
        message("user", "What is my name?"),
    ]
    completed(respond(gateway_url, key, history))
    assert [(m["role"], m["content"]) for m in engine_saw(sim_chat)] == [
        ("user", "My name is Alice."),
        ("assistant", "Hello Alice! How can I help you today?"),
        ("user", "What is my name?"),
    ]


def test_it_compacts_a_conversation(gateway_url: str, key: str, sim_chat: Deployment) -> None:
    # compact-response
    conversation = [
        message("user", "We agreed to launch on Tuesday and notify support first."),
        message("assistant", "Understood: Tuesday, with support told beforehand."),
    ]
    answer = post(
        gateway_url,
        key,
        "/responses/compact",
        {"model": MODEL, "prompt_cache_key": "suite-compact", "input": conversation},
    )
    assert answer.status_code == 200, answer.text
    compacted = answer.json()
    jsonschema.validate(compacted, COMPACTED)
    assert compacted["object"] == "response.compaction"
    assert [item["type"] for item in compacted["output"]][-1] == "compaction"


def test_it_refuses_a_compaction_without_a_model(
    gateway_url: str, key: str, sim_chat: Deployment
) -> None:
    # compact-missing-model
    answer = post(
        gateway_url,
        key,
        "/responses/compact",
        {"input": [message("user", "Compact this conversation.")]},
    )
    assert answer.status_code in (400, 422)
    assert answer.json()["error"]["type"] == "invalid_request_error"
