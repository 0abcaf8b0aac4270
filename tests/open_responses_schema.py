"""The Open Responses specification's required fields and their types, as a JSON Schema of
the project's own (written from the specification's published OpenAPI document): what a
strict client checks first, and what the SDK forgives.

`check_response` validates a response object; `check_event` a stream event (and the
response inside the events that carry one).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx2
import jsonschema
import openai

if TYPE_CHECKING:
    from collections.abc import Iterator

NUMBER = {"type": "number"}
INTEGER = {"type": "integer"}
STRING = {"type": "string"}
NULLABLE_STRING = {"type": ["string", "null"]}
NULLABLE_INTEGER = {"type": ["integer", "null"]}
NULLABLE_OBJECT = {"type": ["object", "null"]}
STATUSES = ["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
ITEM_STATUSES = ["in_progress", "completed", "incomplete", "failed"]

OUTPUT_TEXT = {
    "type": "object",
    "required": ["type", "text", "annotations"],
    "properties": {"type": {"const": "output_text"}, "text": STRING, "annotations": {}},
}
MESSAGE = {
    "type": "object",
    "required": ["id", "type", "role", "status", "content"],
    "properties": {
        "id": STRING,
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "status": {"enum": ITEM_STATUSES},
        "content": {"type": "array", "items": OUTPUT_TEXT},
    },
}
FUNCTION_CALL = {
    "type": "object",
    "required": ["id", "type", "call_id", "name", "arguments", "status"],
    "properties": {
        "type": {"const": "function_call"},
        "call_id": STRING,
        "name": STRING,
        "arguments": STRING,
        "status": {"enum": ITEM_STATUSES},
    },
}
REASONING = {
    "type": "object",
    "required": ["id", "type", "summary"],
    "properties": {"type": {"const": "reasoning"}, "summary": {"type": "array"}},
}
ITEM = {
    "type": "object",
    "required": ["type"],
    "oneOf": [
        {"properties": {"type": {"const": "message"}}, **MESSAGE},
        {"properties": {"type": {"const": "function_call"}}, **FUNCTION_CALL},
        {"properties": {"type": {"const": "reasoning"}}, **REASONING},
        {"properties": {"type": {"enum": ["mcp_call", "mcp_list_tools", "mcp_approval_request"]}}},
    ],
}
FUNCTION_TOOL = {
    "type": "object",
    "required": ["type", "name", "strict"],
    "properties": {
        "type": {"const": "function"},
        "name": STRING,
        "strict": {"type": ["boolean", "null"]},
    },
}
RESPONSE = {
    "type": "object",
    "required": [
        "id",
        "object",
        "created_at",
        "completed_at",
        "status",
        "incomplete_details",
        "model",
        "previous_response_id",
        "instructions",
        "output",
        "error",
        "tools",
        "tool_choice",
        "truncation",
        "parallel_tool_calls",
        "text",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "temperature",
        "reasoning",
        "usage",
        "max_output_tokens",
        "max_tool_calls",
        "store",
        "background",
        "service_tier",
        "metadata",
        "safety_identifier",
        "prompt_cache_key",
    ],
    "properties": {
        "id": STRING,
        "object": {"const": "response"},
        "created_at": INTEGER,
        "completed_at": NULLABLE_INTEGER,
        "status": {"enum": STATUSES},
        "incomplete_details": NULLABLE_OBJECT,
        "model": STRING,
        "previous_response_id": NULLABLE_STRING,
        "instructions": {"type": ["string", "array", "null"]},
        "output": {"type": "array", "items": ITEM},
        "error": NULLABLE_OBJECT,
        "tools": {
            "type": "array",
            "items": {
                "if": {"properties": {"type": {"const": "function"}}},
                "then": FUNCTION_TOOL,
            },
        },
        "tool_choice": {"type": ["string", "object"]},
        "truncation": {"enum": ["auto", "disabled"]},
        "parallel_tool_calls": {"type": "boolean"},
        "text": {"type": "object"},
        "top_p": NUMBER,
        "presence_penalty": NUMBER,
        "frequency_penalty": NUMBER,
        "top_logprobs": INTEGER,
        "temperature": NUMBER,
        "reasoning": NULLABLE_OBJECT,
        "usage": NULLABLE_OBJECT,
        "max_output_tokens": NULLABLE_INTEGER,
        "max_tool_calls": NULLABLE_INTEGER,
        "store": {"type": "boolean"},
        "background": {"type": "boolean"},
        "service_tier": NULLABLE_STRING,
        "metadata": {"type": "object"},
        "safety_identifier": NULLABLE_STRING,
        "prompt_cache_key": NULLABLE_STRING,
        "conversation": {
            "oneOf": [
                {"type": "null"},
                {"type": "object", "required": ["id"], "properties": {"id": STRING}},
            ]
        },
    },
}
CONVERSATION = {
    "type": "object",
    "required": ["id", "object", "created_at", "metadata"],
    "properties": {
        "id": STRING,
        "object": {"const": "conversation"},
        "created_at": INTEGER,
        "metadata": {"type": "object"},
    },
}
ITEM_LIST = {
    "type": "object",
    "required": ["object", "data", "first_id", "last_id", "has_more"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object", "required": ["id", "type"]}},
        "first_id": NULLABLE_STRING,
        "last_id": NULLABLE_STRING,
        "has_more": {"type": "boolean"},
    },
}
# POST /v1/responses/compact's answer (the specification's CompactResource): the kept
# messages of any role, then compaction items.
COMPACTION_ITEM = {
    "type": "object",
    "required": ["id", "type", "encrypted_content"],
    "properties": {
        "id": STRING,
        "type": {"const": "compaction"},
        "encrypted_content": STRING,
        "created_by": STRING,
    },
}
KEPT_MESSAGE = {
    "type": "object",
    "required": ["id", "type", "role", "status", "content"],
    "properties": {
        "id": STRING,
        "type": {"const": "message"},
        "role": {"enum": ["user", "assistant", "system", "developer"]},
        "status": {"enum": ITEM_STATUSES},
        "content": {"type": "array", "items": {"type": "object", "required": ["type"]}},
    },
}
USAGE = {
    "type": "object",
    "required": [
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "input_tokens_details",
        "output_tokens_details",
    ],
    "properties": {
        "input_tokens": INTEGER,
        "output_tokens": INTEGER,
        "total_tokens": INTEGER,
        "input_tokens_details": {"type": "object", "required": ["cached_tokens"]},
        "output_tokens_details": {"type": "object", "required": ["reasoning_tokens"]},
    },
}
COMPACTED = {
    "type": "object",
    "required": ["id", "object", "output", "created_at", "usage"],
    "properties": {
        "id": STRING,
        "object": {"const": "response.compaction"},
        "created_at": INTEGER,
        "output": {"type": "array", "items": {"oneOf": [KEPT_MESSAGE, COMPACTION_ITEM]}},
        "usage": USAGE,
    },
}
EVENT = {
    "type": "object",
    "required": ["type", "sequence_number"],
    "properties": {"type": STRING, "sequence_number": INTEGER},
}


def check_response(response: dict[str, Any]) -> None:
    jsonschema.validate(response, RESPONSE)
    # Items carry statuses consistent with the response's.
    if response["status"] == "completed":
        assert all(item.get("status") != "in_progress" for item in response["output"])
        assert isinstance(response["completed_at"], int)
    if response["status"] == "incomplete":
        last = response["output"][-1] if response["output"] else None
        assert last is None or last.get("status", "incomplete") == "incomplete"


def check_event(event: dict[str, Any]) -> None:
    jsonschema.validate(event, EVENT)
    if isinstance(event.get("response"), dict):
        check_response(event["response"])
    if isinstance(event.get("item"), dict):
        jsonschema.validate(event["item"], ITEM)


def sse_event(block: str) -> tuple[str | None, dict[str, Any] | None]:
    """One SSE block's event name and its JSON data (None for a comment or [DONE])."""
    lines = block.splitlines()
    name = next((line[7:] for line in lines if line.startswith("event: ")), None)
    data = next((line[6:] for line in lines if line.startswith("data: ")), None)
    if data is None or data == "[DONE]":
        return name, None
    event: dict[str, Any] = json.loads(data)
    return name, event


class CheckedEvents(httpx2.SyncByteStream):
    """An SSE stream passed on unchanged, each event checked as it goes by."""

    def __init__(self, inner: httpx2.SyncByteStream) -> None:
        self.inner = inner
        self.buffer = b""

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.buffer += chunk
            while b"\n\n" in self.buffer:
                block, self.buffer = self.buffer.split(b"\n\n", 1)
                self.check(block)
            yield chunk

    def check(self, block: bytes) -> None:
        name, event = sse_event(block.decode())
        if event is None:
            return
        if name is not None:
            assert event["type"] == name, f"SSE event {name!r} carries {event['type']!r}"
        if event.get("type") != "error":
            check_event(event)

    def close(self) -> None:
        self.inner.close()


def conforming_sdk(gateway_url: str, key: str) -> openai.OpenAI:
    """The SDK, with every Responses body and event it receives over HTTP checked."""
    return openai.OpenAI(
        base_url=gateway_url + "/v1",
        api_key=key,
        max_retries=0,
        timeout=60,
        http_client=openai.DefaultHttpxClient(transport=Conforming()),
    )


class Conforming(httpx2.BaseTransport):
    """A transport for the SDK (its HTTP client is httpx2) that checks every Responses body
    and event it receives."""

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        path = request.url.path
        if path.startswith("/v1/conversations"):
            return self.check_conversations(response)
        if not path.startswith("/v1/responses") or path.endswith("/input_items"):
            return response
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            assert isinstance(response.stream, httpx2.SyncByteStream)
            response.stream = CheckedEvents(response.stream)
            return response
        body = response.read()
        data = json.loads(body) if body else None
        if not isinstance(data, dict) or response.status_code != 200:
            return response
        if data.get("object") == "response" and "deleted" not in data:
            check_response(data)
        if data.get("object") == "response.compaction":
            jsonschema.validate(data, COMPACTED)
        return response

    def check_conversations(self, response: httpx2.Response) -> httpx2.Response:
        data = json.loads(response.read() or b"null")
        if response.status_code == 200 and isinstance(data, dict):
            kind = data.get("object")
            if kind == "conversation":
                jsonschema.validate(data, CONVERSATION)
            elif kind == "list":
                jsonschema.validate(data, ITEM_LIST)
        return response

    def close(self) -> None:
        self.inner.close()
