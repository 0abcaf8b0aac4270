"""The simulated engine's /v1/responses, written the way vLLM serves it: the same words as
a chat answer, as a Responses object or its event stream.

It shares nothing with the gateway's own Responses code (openai_api/responses), so a bug
in the gateway's translation cannot hide behind the engine it is tested against.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from deployments.engines.common import error
from deployments.engines.sim_core import (
    Inflight,
    SimState,
    inference,
    model_name,
    pace,
    sse,
    sse_stream,
    tokens_for,
    usage,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def prompt_of(value: Any) -> str | None:
    """The text of the last user turn of `input` (a string or a list of items); None when
    `input` is neither."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return None
    for item in reversed(value):
        if isinstance(item, dict) and item.get("role", "user") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if isinstance(p, dict)]
                return " ".join(str(part) for part in parts)
    return ""


def given(body: dict[str, Any], name: str, default: Any) -> Any:
    """A request's setting, or the engine's own where it sets none."""
    value = body.get(name)
    return default if value is None else value


class Answer:
    """One answer's items and the events that build them, numbered in order."""

    def __init__(self, state: SimState, body: dict[str, Any], prompt: str) -> None:
        limit = body.get("max_output_tokens")
        self.tokens = tokens_for(state, {"max_tokens": limit}, prompt)
        self.reasoning = state.config.reasoning
        self.cut = self.tokens.cut or (limit is not None and len(self.tokens) >= limit)
        if limit is None and self.cut:  # its own limit cut it: the one it was made with
            limit = len(self.tokens)
        self.sequence = 0
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        counted = usage(prompt, self.tokens)  # the chat route's count, in Responses' words
        self.response: dict[str, Any] = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "completed_at": None,
            "model": model_name(state, body),
            "output": [],
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": limit,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": given(body, "temperature", state.config.temperature),
            "top_p": given(body, "top_p", state.config.top_p),
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "truncation": "disabled",
            "metadata": body.get("metadata") or {},
            "usage": {
                "input_tokens": counted["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": counted["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counted["total_tokens"],
            },
        }

    def event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(body, kind)

    def reasoning_item(self) -> dict[str, Any]:
        text = [{"type": "reasoning_text", "text": self.reasoning}]
        return {"id": self.reasoning_id, "type": "reasoning", "summary": [], "content": text}

    def message_item(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [] if status == "in_progress" else [part],
        }

    @property
    def item_status(self) -> str:
        """Its message's, once written: cut at its length, it is incomplete, as its response."""
        return "incomplete" if self.cut else "completed"

    def finished(self) -> dict[str, Any]:
        items = [self.reasoning_item()] if self.reasoning else []
        items.append(self.message_item("".join(self.tokens), self.item_status))
        self.response.update(
            output=items,
            status="incomplete" if self.cut else "completed",
            incomplete_details={"reason": "max_output_tokens"} if self.cut else None,
            completed_at=None if self.cut else int(time.time()),
        )
        return self.response

    async def events(self, state: SimState) -> AsyncIterator[bytes]:
        yield self.event("response.created", response=dict(self.response))
        yield self.event("response.in_progress", response=dict(self.response))
        index = 0
        if self.reasoning:
            item = self.reasoning_item()
            yield self.event("response.output_item.added", output_index=0, item=item)
            where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
            yield self.event("response.reasoning_text.delta", **where, delta=self.reasoning)
            yield self.event("response.reasoning_text.done", **where, text=self.reasoning)
            yield self.event("response.output_item.done", output_index=0, item=item)
            index = 1
        started = self.message_item("", "in_progress")
        yield self.event("response.output_item.added", output_index=index, item=started)
        where = {"item_id": self.message_id, "output_index": index, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        yield self.event("response.content_part.added", **where, part=empty)
        for token in self.tokens:
            await pace(state)
            yield self.event("response.output_text.delta", **where, delta=token, logprobs=[])
        text = "".join(self.tokens)
        yield self.event("response.output_text.done", **where, text=text, logprobs=[])
        done = self.message_item(text, self.item_status)
        yield self.event("response.content_part.done", **where, part=done["content"][0])
        yield self.event("response.output_item.done", output_index=index, item=done)
        final = self.finished()
        kind = "response.incomplete" if self.cut else "response.completed"
        yield self.event(kind, response=final)


@inference
async def responses(
    request: web.Request, state: SimState, body: dict[str, Any]
) -> web.StreamResponse:
    prompt = prompt_of(body.get("input"))
    if prompt is None:
        return error(400, "'input' must be a string or a list of items.", "invalid_request")
    limit = body.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        return error(400, "'max_output_tokens' must be a positive integer.", "invalid_request")
    answer = Answer(state, body, prompt)
    state.last_responses_request = body
    async with Inflight(state, request):
        if body.get("stream"):
            return await sse_stream(request, answer.events(state))
        for _ in answer.tokens:
            await pace(state)
        return web.json_response(answer.finished())
