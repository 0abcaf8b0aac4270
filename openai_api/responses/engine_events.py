"""A deployment with `responses: engine`: its engine's own /v1/responses (vLLM's) answers,
and Modelship keeps what it keeps for any response.

The engine gets the whole context as its input (what `previous_response_id` or the
conversation continue from, resolved by Modelship, then the request's own items) with
`store: false`: stored state lives in Modelship alone, so a response id, its retrieval and
its continuation work the same whichever side answered. The engine's events are passed on
renumbered, under Modelship's envelope (its id, created_at, model), and its final
response's output and usage become the stored response's.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

from openai_api.responses import compaction
from openai_api.responses.image_urls import inlined
from openai_api.responses.made_with import settle_cut
from openai_api.responses.translator import Event, StreamTranslator

if TYPE_CHECKING:
    from openai_api.responses.protocol import ResponsesRequest

# Modelship's own part of a request: the engine never sees these.
KEPT_BY_MODELSHIP = ("previous_response_id", "conversation", "background", "store", "stream")
OPENING = ("response.created", "response.queued", "response.in_progress")
TERMINAL = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}


def engine_request(request: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """What the engine is asked: the request as sent, its context as the input, streamed,
    stored nowhere."""
    body = {k: v for k, v in request.raw.items() if k not in KEPT_BY_MODELSHIP}
    context = compaction.expanded(inlined([*history, *request.input_items], request.images))
    body.update(input=context, stream=True, store=False)
    return body


class EngineEvents(StreamTranslator):
    """The engine's Responses events, passed on (instead of chat chunks translated)."""

    def __init__(self, response: dict[str, Any]) -> None:
        super().__init__(response)
        self.final: dict[str, Any] | None = None  # the engine's response, once it ended

    def relay(self, event: dict[str, Any]) -> list[Event]:
        """One engine event as the client gets it: its opening is Modelship's own (already
        out), its end is kept for finish(), anything else goes on renumbered."""
        kind = event.get("type")
        if not isinstance(kind, str) or kind in OPENING:
            return []
        if kind in TERMINAL:
            final = event.get("response")
            self.final = final if isinstance(final, dict) else {"status": TERMINAL[kind]}
            return []
        fields = {k: v for k, v in event.items() if k not in ("type", "sequence_number")}
        return [self._event(kind, **fields)]

    def finish(self) -> list[Event]:
        """The terminal event, with the engine's output, usage and status."""
        final = self.final or {}
        status = str(final.get("status") or "completed")
        self.response.update(
            output=final.get("output") or [],
            usage=usage_of(final.get("usage")),
            status=status,
            incomplete_details=final.get("incomplete_details"),
        )
        details = final.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason") == "max_output_tokens":
            counted = (self.response["usage"] or {}).get("output_tokens")
            settle_cut(self.response, final.get("max_output_tokens"), counted, self.ceiling)
        if status == "failed":
            self.response["error"] = final.get("error")
        if status == "completed":
            self.response["completed_at"] = final.get("completed_at") or int(time.time())
        kind = next((k for k, v in TERMINAL.items() if v == status), "response.completed")
        return [self._event(kind, response=copy.deepcopy(self.response))]


def usage_of(usage: Any) -> dict[str, Any] | None:
    """The engine's usage in OpenAI's shape (vLLM adds per-turn lists of its own)."""
    if not isinstance(usage, dict):
        return None

    def count(key: str, within: str | None = None) -> int:
        source = usage.get(within) if within else usage
        value = source.get(key) if isinstance(source, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    input_tokens, output_tokens = count("input_tokens"), count("output_tokens")
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": count("cached_tokens", "input_tokens_details")},
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": count("reasoning_tokens", "output_tokens_details")
        },
        "total_tokens": input_tokens + output_tokens,
    }
