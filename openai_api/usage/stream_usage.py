"""Usage from streamed answers: a streamed chat or completion carries its token counts only
where the client asks (stream_options.include_usage). The gateway asks the engine for them
whatever the client asked, and where the client did not ask, takes the usage event out of
the answer (its figures go to the request's record), so the client gets the stream it asked
for and the counts are the engine's own, not an estimate.

The usage event is the one whose `choices` is empty (OpenAI's and vLLM's shape); an engine
that puts usage on its last content chunk instead has it left there (it is read from the
answer's tail as any usage is), and an event the engine split across two writes is passed on
as it came."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from openai_api.access import RequestRecord

ASKED_ON = frozenset({"chat/completions", "completions"})


def with_usage_asked(endpoint: str, streaming: bool, data: dict[str, Any] | None) -> Any:
    """The body to send where the gateway must ask for usage the client did not, else None."""
    if not streaming or endpoint not in ASKED_ON or not isinstance(data, dict):
        return None
    if not (settings.MSHIP_USAGE_FROM_STREAMS and settings.MSHIP_USAGE_RECORD):
        return None
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None  # the client asked: its answer keeps the event
    if options is not None and not isinstance(options, dict):
        return None  # the engine answers a malformed option as it would
    return {**data, "stream_options": {**(options or {}), "include_usage": True}}


def usage_event(event: bytes) -> tuple[int, int, int] | None:
    """The counts of a usage-only SSE event (`data: {..., "choices": [], "usage": {...}}`)."""
    if not event.startswith(b"data: {") or b'"usage"' not in event:
        return None
    try:
        chunk = json.loads(event[6:])
        usage = chunk["usage"]
        if chunk.get("choices") != [] or not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details") or {}
        return (
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class UsageStripper:
    """A `send` that passes an answer on without its usage-only event."""

    __slots__ = ("record", "send")

    def __init__(
        self, send: Callable[[dict[str, Any]], Awaitable[None]], record: RequestRecord
    ) -> None:
        self.send = send
        self.record = record

    async def __call__(self, message: dict[str, Any]) -> None:
        body = message.get("body", b"")
        if message["type"] == "http.response.body" and b'"usage"' in body:
            message = {**message, "body": self.without_usage(body)}
        await self.send(message)

    def without_usage(self, body: bytes) -> bytes:
        kept = []
        for event in body.split(b"\n\n"):
            counts = usage_event(event.strip())
            if counts is None:
                kept.append(event)
            else:
                self.record.reported = counts
        return b"\n\n".join(kept)
