"""The queued notice: a request that has to wait for memory is told so, where its client
can take it, as the on-demand seed says.

A streaming chat/completions or completions request gets 200 with SSE headers and one chunk
(`id: "ondemand-queued"`, the served name, the notice as the assistant's content) as soon as
it queues; the engine's SSE bytes follow unchanged, and a later error arrives as
`data: {"error": ...}` then `data: [DONE]`. A non-streaming answer of a request that queued
gets the notice prepended to its text. Responses and Anthropic messages streams, other
endpoints and requests asking for structured output never get one.

A stream that waits for a start that first pulls an image or installs an engine environment
(minutes) is told so too, with a chunk of the same shape for each.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from openai_api import wait_status
from openai_api.endpoints import notice_eligible

if TYPE_CHECKING:
    from openai_api.keepalive import SseOpener

STRUCTURED = (
    "response_format",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "structured_outputs",
)


def structured(data: dict[str, Any]) -> bool:
    if any(data.get(key) is not None for key in STRUCTURED):
        return True
    if any(key.startswith("guided_") and value is not None for key, value in data.items()):
        return True
    text_format = (
        (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    )
    return isinstance(text_format, dict) and text_format.get("type", "text") != "text"


def eligible(endpoint: str, data: dict[str, Any] | None, streaming: bool) -> bool:
    if data is None or structured(data):
        return False
    return notice_eligible(endpoint, streaming)


def text_for(name: str, figures: dict[str, Any] | None = None) -> str:
    said = wait_status.words(figures or {})
    waited = (
        f"had to wait for memory to start ({said})" if said else "had to wait for memory to start"
    )
    return f"[{name} {waited}; it is starting now and its answer follows.]\n\n"


def preparing_text(name: str, doing: str) -> str:
    return f"[{name} is {doing} before it can start; its answer follows once it has started.]\n\n"


def chunk(endpoint: str, name: str, text: str | None = None) -> bytes:
    text = text_for(name) if text is None else text
    created = int(time.time())
    if endpoint == "completions":
        body: dict[str, Any] = {
            "id": "ondemand-queued",
            "object": "text_completion",
            "created": created,
            "model": name,
            "choices": [{"index": 0, "text": text, "finish_reason": None}],
        }
    else:
        body = {
            "id": "ondemand-queued",
            "object": "chat.completion.chunk",
            "created": created,
            "model": name,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": text},
                    "finish_reason": None,
                }
            ],
        }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def prepend(endpoint: str, name: str, raw: bytes, figures: dict[str, Any] | None = None) -> bytes:
    """The engine's non-streaming answer with the notice in front of its text, or as it was
    where there is no text to put it in front of."""
    try:
        body = json.loads(raw)
        notice = text_for(name, figures)
        if endpoint == "chat/completions":
            message = body["choices"][0]["message"]
            if not isinstance(message.get("content"), str):
                return raw  # a tool-call answer with null content is left alone
            message["content"] = notice + message["content"]
        elif endpoint == "completions":
            body["choices"][0]["text"] = notice + body["choices"][0]["text"]
        else:
            item = next(i for i in body["output"] if i.get("type") == "message")
            part = next(p for p in item["content"] if p.get("type") == "output_text")
            part["text"] = notice + part["text"]
    except (ValueError, KeyError, IndexError, TypeError, StopIteration):
        return raw
    return json.dumps(body).encode()


class QueuedNotice:
    """One request's notice: sent (streaming) or remembered (not) when it queues; a stream
    also hears what the start it waits for does first (an install, a pull)."""

    def __init__(
        self,
        opener: SseOpener | None,
        endpoint: str,
        name: str,
        streaming: bool,
        tells_preparing: bool = True,
    ):
        self.opener = opener  # a streaming request's answer, which the chunk may open
        self.endpoint = endpoint
        self.name = name
        self.streaming = streaming
        # /v1 only: on /ondemand a stream that only waits for a start gets nothing (the seed).
        self.tells_preparing = tells_preparing
        self.queued = False
        self.figures: dict[str, Any] | None = None  # its place and estimate when it queued
        self.told: set[str] = set()  # what it was told the start is doing
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False  # the engine is called: nothing more of ours

    def on_queued(self, figures: dict[str, Any] | None = None) -> None:
        if not self.queued:
            self.queued = True
            self.figures = figures
            self._stream(text_for(self.name, figures))

    def on_preparing(self, doing: str) -> None:
        if self.tells_preparing and doing not in self.told:
            self.told.add(doing)
            self._stream(preparing_text(self.name, doing))

    def _stream(self, text: str) -> None:
        if self.streaming and self.opener is not None and not self.closed:
            body = chunk(self.endpoint, self.name, text)
            self.tasks.append(asyncio.ensure_future(self.opener.write(body)))

    async def sent(self) -> None:
        self.closed = True
        for task in self.tasks:
            await task

    def transform(self) -> Any:
        if self.streaming or not self.queued:
            return None
        return lambda raw: prepend(self.endpoint, self.name, raw, self.figures)
