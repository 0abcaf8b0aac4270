"""Cache figures taken out of an engine's answer where they could tell one tenant what
another sent (openai_api/cache_scope.py).

An engine that keeps one prefix cache for everyone (llama.cpp) reports how much of a prompt
it found there: `usage.prompt_tokens_details.cached_tokens`, `timings.cache_n`, the slot that
held it (`id_slot`), Anthropic's `cache_read_input_tokens`. A probe that resends a guessed
prompt would read another tenant's. Under MSHIP_CACHE_FIGURES (`own`, the default: where the
engine cannot keep tenants apart; `none`: everywhere) they are taken out of the answer, a
stream's events one by one and a whole answer at its end; the count still goes to the
request's usage (its cached tokens), which only the site sees."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.conf import settings

from openai_api.cache_scope import keeps_apart

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from openai_api.access import RequestRecord
    from openai_api.catalog import Route

MARKERS = (b'"timings"', b'"id_slot"', b'"cached_tokens"', b'"cache_read_input_tokens"')
# A whole (unstreamed) answer is read to its end to be rewritten, up to this size: past it,
# it goes as it came (an answer that large is no probe's).
WHOLE_CAP = 8 * 2**20


def without_length(start: dict[str, Any]) -> list[Any]:
    return [h for h in start.get("headers", []) if h[0].lower() != b"content-length"]


def hides(route: Route, endpoint: str = "") -> bool:
    figures = settings.MSHIP_CACHE_FIGURES
    # vLLM's Anthropic messages take no cache salt: its cache there is everyone's.
    apart = keeps_apart(route) and not (endpoint == "messages" and route.loader == "vllm")
    return figures == "none" or (figures == "own" and not apart)


def without_figures(doc: Any, depth: int = 0) -> int | None:
    """Takes the cache figures out of an answer (or a stream's chunk, its `message` or
    `response` included: Anthropic's message_start, a Responses event); the count it had."""
    if not isinstance(doc, dict):
        return None
    found: int | None = None
    if depth < 2:
        for inner in ("message", "response"):
            count = without_figures(doc.get(inner), depth + 1)
            found = count if count is not None else found
    timings = doc.pop("timings", None)
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        found = timings["cache_n"]
    doc.pop("id_slot", None)
    usage = doc.get("usage")
    if isinstance(usage, dict):
        for details in ("prompt_tokens_details", "input_tokens_details"):
            held = usage.get(details)
            if isinstance(held, dict) and "cached_tokens" in held:
                count = held.pop("cached_tokens")
                found = count if isinstance(count, int) else found
                if not held:
                    del usage[details]
        count = usage.pop("cache_read_input_tokens", None)
        found = count if isinstance(count, int) else found
    return found


class FigureHider:
    """A `send` that passes an answer on without its cache figures: a stream's events as
    each is whole; a whole answer once it is in, its length said again (its start is held
    until then)."""

    __slots__ = ("carry", "record", "send", "start", "streaming")

    def __init__(
        self,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        record: RequestRecord,
        streaming: bool,
    ) -> None:
        self.send = send
        self.record = record
        self.streaming = streaming
        self.carry = b""
        self.start: dict[str, Any] | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            if self.streaming:  # an event's length changes: no length for the whole
                await self.send({**message, "headers": without_length(message)})
            else:
                self.start = message
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        more = bool(message.get("more_body", False))
        body = self.carry + message.get("body", b"")
        self.carry = b""
        if self.streaming:
            end = body.rfind(b"\n\n")
            if more and end < 0 and len(body) <= WHOLE_CAP:
                self.carry = body  # no whole event yet: it goes once it is whole
                return
            cut = end + 2 if more and end >= 0 else len(body)
            body, self.carry = self.events(body[:cut]), body[cut:]
        elif self.start is not None:
            if more and len(body) <= WHOLE_CAP:
                self.carry = body  # a whole answer is rewritten at its end
                return
            start, self.start = self.start, None
            if not more:  # whole: rewritten, its length said anew (past the cap: as it came)
                body = self.whole(body)
                if len(without_length(start)) != len(start.get("headers", [])):
                    length = (b"content-length", str(len(body)).encode())
                    start = {**start, "headers": [*without_length(start), length]}
            await self.send(start)
        await self.send({**message, "body": body})

    def events(self, block: bytes) -> bytes:
        if not any(marker in block for marker in MARKERS):
            return block
        kept = []
        for event in block.split(b"\n\n"):
            if any(marker in event for marker in MARKERS):
                # Its data line, after any `event:` line (Anthropic's streams name theirs).
                lines = event.split(b"\n")
                for n, line in enumerate(lines):
                    if line.startswith(b"data: {"):
                        lines[n] = b"data: " + self.rewritten(line[6:], line[6:])
                event = b"\n".join(lines)
            kept.append(event)
        return b"\n\n".join(kept)

    def whole(self, body: bytes) -> bytes:
        if len(body) > WHOLE_CAP or not any(marker in body for marker in MARKERS):
            return body
        return self.rewritten(body, body)

    def rewritten(self, text: bytes, otherwise: bytes) -> bytes:
        try:
            doc = json.loads(text)
        except ValueError:
            return otherwise
        count = without_figures(doc)
        if count is not None:
            self.record.cached_seen = max(self.record.cached_seen, count)
        return json.dumps(doc, ensure_ascii=False).encode()
