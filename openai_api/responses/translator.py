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
import time
from typing import Any

import orjson

from openai_api.responses.fields import new_id
from openai_api.responses.made_with import settle_cut

Event = dict[str, Any]


class Item:
    """One output item being built."""

    def __init__(self, index: int, kind: str, **fields: Any) -> None:
        self.index = index
        self.kind = kind
        self.id = fields.pop("id")
        self.fields = fields
        self.text = ""
        self.done = False
        self.cut = False  # ended by max_output_tokens: incomplete, like its response

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
        if self.kind == "function_call":
            return {
                "id": self.id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": self.fields["call_id"],
                "name": self.fields["name"],
                "arguments": "",
            }
        if self.kind == "mcp_call":
            return {
                "id": self.id,
                "type": "mcp_call",
                "status": "in_progress",
                "server_label": self.fields["server_label"],
                "name": self.fields["name"],
                "arguments": "",
                "approval_request_id": self.fields.get("approval_request_id"),
                "output": None,
                "error": None,
            }
        if self.kind == "mcp_approval_request":
            return {
                "id": self.id,
                "type": "mcp_approval_request",
                "server_label": self.fields["server_label"],
                "name": self.fields["name"],
                "arguments": self.text,
            }
        return {"id": self.id, **self.fields}  # made whole by the MCP loop

    def closed(self) -> dict[str, Any]:
        status = "incomplete" if self.cut else "completed"
        if self.kind == "message":
            return {**self.opened(), "status": status, "content": [_text_part(self.text)]}
        if self.kind == "reasoning":
            return {**self.opened(), "summary": [{"type": "summary_text", "text": self.text}]}
        if self.kind == "function_call":
            return {**self.opened(), "status": status, "arguments": self.text}
        if self.kind == "mcp_call":
            failed = self.fields.get("error") is not None
            return {
                **self.opened(),
                "status": "failed" if failed else "completed",
                "arguments": self.text,
                "output": self.fields.get("output"),
                "error": self.fields.get("error"),
            }
        return self.opened()


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
        self.usage: dict[str, Any] | None = None  # this turn's
        self.usage_before: list[dict[str, Any]] = []  # earlier turns' (the MCP loop)
        self.mcp_tools: dict[str, str] = {}  # tool name -> server label: calls become mcp_call
        self.mcp_approval: set[str] = set()  # ... or mcp_approval_request, for these
        # The limit a response cut by its length says it was made with, where neither its
        # request nor its deployment said one and its engine did not count (made_with.py).
        self.ceiling: int | None = None

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
            name = function.get("name", "")
            if name in self.mcp_approval:
                # Asked, not run: the client approves it in its next request.
                item, events = self._open(
                    "mcp_approval_request",
                    id=new_id("mcpr"),
                    call_id=call_id,
                    name=name,
                    server_label=self.mcp_tools[name],
                )
            elif name in self.mcp_tools:
                item, events = self._open(
                    "mcp_call",
                    id=new_id("mcp"),
                    call_id=call_id,
                    name=name,
                    server_label=self.mcp_tools[name],
                )
                events.append(self._where("response.mcp_call.in_progress", item))
            else:
                item, events = self._open(
                    "function_call", id=new_id("fc"), call_id=call_id, name=name
                )
            self.calls[index] = item
        elif function.get("name"):
            item.fields["name"] += function["name"]
        arguments = function.get("arguments") or ""
        if arguments:
            item.text += arguments
            if item.kind == "mcp_call":
                events.append(
                    self._where("response.mcp_call_arguments.delta", item, delta=arguments)
                )
            elif item.kind == "function_call":
                events.append(
                    self._where("response.function_call_arguments.delta", item, delta=arguments)
                )
        return events

    def _where(self, kind: str, item: Item, **fields: Any) -> Event:
        return self._event(kind, item_id=item.id, output_index=item.index, **fields)

    # --- turns and MCP items (the MCP loop) --------------------------------------------------

    def end_turn(self) -> tuple[list[Event], list[Item]]:
        """Close this turn's items; MCP calls stay open for their execution and are
        returned (their arguments complete)."""
        events: list[Event] = []
        pending = []
        for item in [self.reasoning, self.message, *self.calls.values()]:
            if item is None or item.done:
                continue
            if item.kind == "mcp_call":
                events.append(
                    self._where("response.mcp_call_arguments.done", item, arguments=item.text)
                )
                pending.append(item)
            else:
                events += self._close(item)
                if item.kind == "mcp_approval_request":
                    pending.append(item)
        if self.usage is not None:
            self.usage_before.append(self.usage)
        self.reasoning, self.message, self.calls, self.usage = None, None, {}, None
        return events, pending

    def turn_calls(self) -> list[Item]:
        """This turn's tool calls, MCP or not, in the order the model made them."""
        return list(self.calls.values())

    def finish_mcp_call(
        self, item: Item, output: str | None = None, error: dict[str, Any] | None = None
    ) -> list[Event]:
        item.fields["output"], item.fields["error"] = output, error
        kind = "response.mcp_call.failed" if error is not None else "response.mcp_call.completed"
        item.done = True
        return [
            self._where(kind, item),
            self._event("response.output_item.done", output_index=item.index, item=item.closed()),
        ]

    def open_mcp_call(
        self, label: str, name: str, arguments: str, approval_request_id: str
    ) -> tuple[Item, list[Event]]:
        """An approved call, run before the model's next turn."""
        item, events = self._open(
            "mcp_call",
            id=new_id("mcp"),
            call_id=new_id("call"),
            name=name,
            server_label=label,
            approval_request_id=approval_request_id,
        )
        item.text = arguments
        events.append(self._where("response.mcp_call.in_progress", item))
        events.append(self._where("response.mcp_call_arguments.done", item, arguments=arguments))
        return item, events

    def open_list_tools(self, label: str) -> tuple[Item, list[Event]]:
        item, events = self._open(
            "mcp_list_tools", id=new_id("mcpl"), type="mcp_list_tools", server_label=label, tools=[]
        )
        events.append(self._where("response.mcp_list_tools.in_progress", item))
        return item, events

    def finish_list_tools(
        self, item: Item, tools: list[dict[str, Any]], error: str | None = None
    ) -> list[Event]:
        item.fields["tools"] = tools
        if error is not None:
            item.fields["error"] = error
        kind = "response.mcp_list_tools.failed" if error else "response.mcp_list_tools.completed"
        item.done = True
        return [
            self._where(kind, item),
            self._event("response.output_item.done", output_index=item.index, item=item.closed()),
        ]

    def finish(self) -> list[Event]:
        """Every open item's closing events, then the response's terminal event."""
        events: list[Event] = []
        for item in self.items:
            if not item.done:
                item.cut = self.finish_reason == "length"
                events += self._close(item)
        self.response["output"] = [item.closed() for item in self.items]
        self.response["usage"] = self._usage()
        if self.finish_reason == "length":
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            settle_cut(self.response, (self.usage or {}).get("completion_tokens"), self.ceiling)
            kind = "response.incomplete"
        else:
            self.response["status"] = "completed"
            self.response["completed_at"] = int(time.time())
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
        item.done = True
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
        elif item.kind == "mcp_approval_request":
            pass  # whole at once: only its output_item.done
        elif item.kind == "mcp_call":  # never executed (the response ended first)
            item.fields["error"] = {"type": "mcp_protocol_error", "code": -1, "message": "not run"}
            events.append(self._where("response.mcp_call.failed", item))
        elif item.kind == "function_call":
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
        turns = [*self.usage_before, *([self.usage] if self.usage is not None else [])]
        if not turns:
            return None

        def total(key: str, within: str | None = None) -> int:
            return sum(int(((u.get(within) or {}) if within else u).get(key) or 0) for u in turns)

        input_tokens, output_tokens = total("prompt_tokens"), total("completion_tokens")
        cached = total("cached_tokens", "prompt_tokens_details")
        reasoning = total("reasoning_tokens", "completion_tokens_details")
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": input_tokens + output_tokens,
        }


# The Open Responses specification's terminal event, after the last event of a stream.
DONE = b"data: [DONE]\n\n"


def sse(event: Event) -> bytes:
    # orjson: an event per token, and the stdlib's encoder was a visible share of a stream.
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
