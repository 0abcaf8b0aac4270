"""From the engine's chat completion chunks to the Responses event protocol.

Fed each chunk as it arrives, the translator returns the events it makes: `response.created`
and `response.in_progress` first, then per output item `output_item.added`, its part or
summary opening, the deltas, and at the end every item's closing events in output order and
exactly one terminal event (`response.completed`, `response.incomplete` or, after an
`error` event, `response.failed`). Items open lazily on their first delta (reasoning, text,
each tool call), so the translation does not depend on how a model interleaves them. The
same object accumulates the whole response, which is what a non-streaming answer returns.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from openai_api.responses.protocol import new_id

Event = dict[str, Any]


class Item:
    """One output item being built."""

    def __init__(self, index: int, kind: str, **fields: Any) -> None:
        self.index = index
        self.kind = kind
        self.id = fields.pop("id")
        self.fields = fields
        self.text = ""

    def opened(self) -> dict[str, Any]:
        if self.kind == "message":
            return {
                "id": self.id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "summary": []}
        return {
            "id": self.id,
            "type": "function_call",
            "status": "in_progress",
            "call_id": self.fields["call_id"],
            "name": self.fields["name"],
            "arguments": "",
        }

    def closed(self) -> dict[str, Any]:
        if self.kind == "message":
            return {
                **self.opened(),
                "status": "completed",
                "content": [_text_part(self.text)],
            }
        if self.kind == "reasoning":
            return {**self.opened(), "summary": [{"type": "summary_text", "text": self.text}]}
        return {**self.opened(), "status": "completed", "arguments": self.text}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class StreamTranslator:
    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response  # the envelope; its output fills in as items close
        self.sequence = 0
        self.items: list[Item] = []
        self.reasoning: Item | None = None
        self.message: Item | None = None
        self.calls: dict[int, Item] = {}  # the engine's tool call index -> item
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    # --- events ----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self, created_status: str = "in_progress") -> list[Event]:
        """`response.created` (queued for a background run) and `response.in_progress`."""
        self.response["status"] = created_status
        created = self._event("response.created", response=copy.deepcopy(self.response))
        self.response["status"] = "in_progress"
        return [created, self._event("response.in_progress", response=copy.deepcopy(self.response))]

    def _open(self, kind: str, **fields: Any) -> tuple[Item, list[Event]]:
        item = Item(len(self.items), kind, **fields)
        self.items.append(item)
        events = [
            self._event("response.output_item.added", output_index=item.index, item=item.opened())
        ]
        if kind == "message":
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item.id,
                    output_index=item.index,
                    content_index=0,
                    part=_text_part(""),
                )
            )
        elif kind == "reasoning":
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item.id,
                    output_index=item.index,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        return item, events

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """The events for one chat completion chunk."""
        events: list[Event] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                if self.reasoning is None:
                    self.reasoning, opened = self._open("reasoning", id=new_id("rs"))
                    events += opened
                self.reasoning.text += thought
                events.append(
                    self._event(
                        "response.reasoning_summary_text.delta",
                        item_id=self.reasoning.id,
                        output_index=self.reasoning.index,
                        summary_index=0,
                        delta=thought,
                    )
                )
            if delta.get("content"):
                if self.message is None:
                    self.message, opened = self._open("message", id=new_id("msg"))
                    events += opened
                self.message.text += delta["content"]
                events.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.message.id,
                        output_index=self.message.index,
                        content_index=0,
                        delta=delta["content"],
                        logprobs=[],
                    )
                )
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        index = call.get("index", len(self.calls))
        function = call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            call_id = call.get("id") or new_id("call")
            item, events = self._open(
                "function_call", id=new_id("fc"), call_id=call_id, name=function.get("name", "")
            )
            self.calls[index] = item
        elif function.get("name"):
            item.fields["name"] += function["name"]
        arguments = function.get("arguments") or ""
        if arguments:
            item.text += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=item.index,
                    delta=arguments,
                )
            )
        return events

    def finish(self) -> list[Event]:
        """Every open item's closing events, then the response's terminal event."""
        events: list[Event] = []
        for item in self.items:
            events += self._close(item)
        self.response["output"] = [item.closed() for item in self.items]
        self.response["usage"] = self._usage()
        if self.finish_reason == "length":
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            kind = "response.incomplete"
        else:
            self.response["status"] = "completed"
            kind = "response.completed"
        events.append(self._event(kind, response=copy.deepcopy(self.response)))
        return events

    def fail(self, code: str, message: str) -> list[Event]:
        """An engine error mid-stream: `error`, then `response.failed`."""
        self.response["output"] = [item.closed() for item in self.items]
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": message}
        return [
            self._event("error", code=code, message=message, param=None),
            self._event("response.failed", response=copy.deepcopy(self.response)),
        ]

    def _close(self, item: Item) -> list[Event]:
        where = {"item_id": item.id, "output_index": item.index}
        events: list[Event] = []
        if item.kind == "message":
            events.append(
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=item.text,
                    logprobs=[],
                )
            )
            events.append(
                self._event(
                    "response.content_part.done",
                    **where,
                    content_index=0,
                    part=_text_part(item.text),
                )
            )
        elif item.kind == "reasoning":
            events.append(
                self._event(
                    "response.reasoning_summary_text.done", **where, summary_index=0, text=item.text
                )
            )
            events.append(
                self._event(
                    "response.reasoning_summary_part.done",
                    **where,
                    summary_index=0,
                    part={"type": "summary_text", "text": item.text},
                )
            )
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item.fields["name"],
                    arguments=item.text,
                )
            )
        events.append(
            self._event("response.output_item.done", output_index=item.index, item=item.closed())
        )
        return events

    def _usage(self) -> dict[str, Any] | None:
        if self.usage is None:
            return None
        details = self.usage.get("completion_tokens_details") or {}
        prompt_details = self.usage.get("prompt_tokens_details") or {}
        input_tokens = int(self.usage.get("prompt_tokens") or 0)
        output_tokens = int(self.usage.get("completion_tokens") or 0)
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {
                "cached_tokens": int(prompt_details.get("cached_tokens") or 0)
            },
            "output_tokens": output_tokens,
            "output_tokens_details": {
                "reasoning_tokens": int(details.get("reasoning_tokens") or 0)
            },
            "total_tokens": int(self.usage.get("total_tokens") or input_tokens + output_tokens),
        }


def sse(event: Event) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
