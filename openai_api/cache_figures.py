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


def hides(route: Route) -> bool:
    figures = settings.MSHIP_CACHE_FIGURES
    return figures == "none" or (figures == "own" and not keeps_apart(route))


def without_figures(doc: Any) -> int | None:
    """Takes the cache figures out of an answer (or a stream's chunk); the count it had."""
    if not isinstance(doc, dict):
        return None
    found: int | None = None
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
    """A `send` that passes an answer on without its cache figures."""

    __slots__ = ("carry", "record", "send", "streaming")

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

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            # Its length changes: sent chunked instead.
            headers = [h for h in message.get("headers", []) if h[0].lower() != b"content-length"]
            await self.send({**message, "headers": headers})
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        more = bool(message.get("more_body", False))
        body = self.carry + message.get("body", b"")
        if self.streaming:
            cut = body.rfind(b"\n\n") + 2 if more else len(body)
            body, self.carry = self.events(body[:cut]), body[cut:]
        elif more and len(body) <= WHOLE_CAP:
            self.carry = body  # a whole answer is rewritten at its end
            return
        else:
            body, self.carry = self.whole(body), b""
        await self.send({**message, "body": body})

    def events(self, block: bytes) -> bytes:
        if not any(marker in block for marker in MARKERS):
            return block
        kept = []
        for event in block.split(b"\n\n"):
            if event.startswith(b"data: {") and any(marker in event for marker in MARKERS):
                event = b"data: " + self.rewritten(event[6:], event[6:])
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
