"""A foreground response (not `background`), start to end, whatever carries its events: a
POST's SSE stream or JSON body, or a WebSocket."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from openai_api import access
from openai_api.errors import GatewayError
from openai_api.keepalive import waiting_answer
from openai_api.responses import store
from openai_api.responses.engine_turn import conclude
from openai_api.responses.respond import respond

if TYPE_CHECKING:
    from openai_api.keepalive import SseOpener
    from openai_api.responses.translator import Event
    from openai_api.responses.turn import Turn


class Out(Protocol):
    """Where a foreground response's events go: an SSE stream, a JSON body, a WebSocket."""

    @property
    def opened(self) -> bool:
        """Whether anything of the answer went out (a refusal is then its last event)."""
        ...

    @property
    def opener(self) -> SseOpener | None:
        """The SSE answer keepalives may open while the turn waits for its slot."""
        ...

    async def emit(self, events: list[Event]) -> None: ...


class Opening:
    """A response's opening events (created, in_progress), held until the engine answers:
    a refusal before that is a plain error, not a response that failed."""

    def __init__(self) -> None:
        self.pending: list[Event] = []

    def release(self, events: list[Event]) -> list[Event]:
        """What goes out now: nothing while only the opening is known, then the opening
        with what follows it."""
        if events and events[0]["type"] == "response.created":
            self.pending = events
            return []
        out, self.pending = [*self.pending, *events], []
        return out


async def run(turn: Turn, out: Out, request_id: str, generate: bool = True) -> None:
    """A foreground response, start to end: its events out, the response kept (stored,
    added to its conversation) before its terminal event. `generate=False` (a WebSocket's
    warm-up) makes no output and calls no engine."""
    translator, request = turn.translator, turn.request

    async def save(finished: dict[str, Any]) -> None:
        await store.run(store.save_turn, turn.identity, request, finished, turn.context)

    keeps = request.store or request.conversation is not None
    waiting_answer.set(out.opener)
    await out.emit(translator.start())
    try:
        done = (
            await respond(turn.route, request, turn.history, translator, out.emit, request_id)
            if generate
            else True  # a warm-up: the response (and what it continues) kept, no output
        )
    except GatewayError as exc:
        if not out.opened:
            raise  # nothing went out: a plain error
        # Keepalives opened the stream while it waited: the refusal is its last event.
        await out.emit(translator.fail(exc.code, exc.message))
        done = False
    if done:
        await conclude(translator, out.emit, save if keeps else None)
    elif request.store:  # a failed response can still be retrieved
        with contextlib.suppress(GatewayError):
            await save(translator.response)
    access.note_usage(translator.response.get("usage"))
