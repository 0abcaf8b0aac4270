"""Record vLLM's own chat streams with reasoning and tool-call deltas, for the replay tests
(tests/test_vllm_streams.py), from a real vLLM serving the tiny Llama
(`manage.py make_tiny_model --kind hf-llama`) with

    --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser deepseek_r1
    --structured-outputs-config '{"enable_in_reasoning": true}'

The tiny model's words are noise; a regex of vLLM's structured output makes it say exactly
what each recording needs, so vLLM's parsers split it as they would a real model's.

Run: ``python scripts/record_vllm_streams.py http://127.0.0.1:8000 tiny``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RECORDINGS: dict[str, dict[str, Any]] = {
    "reasoning_then_text": {
        "regex": r"Paris is in France\.</think>It is sunny there\.",
    },
    "reasoning_then_tool_call": {
        "regex": r'I should look\.</think><tool_call>\{"name": "get_weather", '
        r'"arguments": \{"city": "Paris"\}\}</tool_call>',
        "tools": [WEATHER],
    },
}


def token_id(url: str, model: str, text: str) -> int:
    answer = httpx.post(
        url + "/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False}
    )
    [token] = answer.json()["tokens"]
    return int(token)


def record(url: str, model: str, name: str, regex: str, tools: list[Any] | None = None) -> None:
    # The regex allows `</think>` as one token or as its letters; the parser needs the one.
    end_of_thought = token_id(url, model, "</think>")
    body: dict[str, Any] = {
        "logit_bias": {str(end_of_thought): 100},
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 120,
        "stream": True,
        "stream_options": {"include_usage": True},
        "structured_outputs": {"regex": regex},
    }
    if tools:
        body["tools"] = tools
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as answer:
        answer.raise_for_status()
        (OUT / f"{name}.sse").write_bytes(b"".join(answer.iter_raw()))


def main() -> None:
    url, model = sys.argv[1].rstrip("/"), sys.argv[2]
    OUT.mkdir(parents=True, exist_ok=True)
    for name, recording in RECORDINGS.items():
        record(url, model, name, **recording)
        print(f"recorded {name}")


if __name__ == "__main__":
    main()
