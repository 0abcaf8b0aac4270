"""The Responses translation over streams a real vLLM sent: chat completion streams with
reasoning and tool-call deltas as vLLM 0.32's parsers (deepseek_r1, hermes) cut them,
recorded from the tiny Llama by scripts/record_vllm_streams.py (the tiny model's noise is
steered by a structured-output regex) and kept in tests/data/vllm/. Replayed here through
the translator, every event checked against the Open Responses schema."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from openai_api.responses import protocol
from openai_api.responses.translator import StreamTranslator
from tests.open_responses_schema import check_event

RECORDED = Path(__file__).parent / "data" / "vllm"


def replay(name: str, **request: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every event the translator makes of a recorded stream, and the finished response."""
    parsed = protocol.parse({"model": "tiny", "input": "Weather in Paris?", **request})
    translator = StreamTranslator(protocol.envelope(parsed, "resp_1", int(time.time()), "queued"))
    events = translator.start()
    for line in (RECORDED / f"{name}.sse").read_text().splitlines():
        if line.startswith("data: {"):
            events += translator.feed(json.loads(line[6:]))
    events += translator.finish()
    for event in events:
        check_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events, translator.response


def deltas(events: list[dict[str, Any]], kind: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind)


def test_it_makes_a_reasoning_item_and_a_message_of_vllms_reasoning_and_content() -> None:
    events, response = replay("reasoning_then_text")
    assert deltas(events, "response.reasoning_summary_text.delta") == "Paris is in France."
    assert deltas(events, "response.output_text.delta") == "It is sunny there."
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Paris is in France."}]
    assert message["content"][0]["text"] == "It is sunny there."
    assert (response["status"], events[-1]["type"]) == ("completed", "response.completed")
    usage = response["usage"]
    assert usage["output_tokens"] > 0 and usage["input_tokens"] > 0  # vLLM's own count
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_it_makes_a_function_call_of_vllms_tool_call_deltas() -> None:
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    events, response = replay("reasoning_then_tool_call", tools=[weather])
    assert deltas(events, "response.reasoning_summary_text.delta") == "I should look."
    reasoning, call = response["output"]
    assert reasoning["type"] == "reasoning"
    assert (call["type"], call["name"], call["status"]) == (
        "function_call",
        "get_weather",
        "completed",
    )
    assert call["call_id"]  # vLLM's id for the call, kept for the answer that follows
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    streamed = deltas(events, "response.function_call_arguments.delta")
    assert json.loads(streamed) == {"city": "Paris"}
    [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == call["arguments"]
    assert response["status"] == "completed"
