"""A Responses create, checked and ready to run: its request, what it continues from and
the translator its response is built in. Every transport (a POST, a background run, a
WebSocket) prepares its creates here, so each refuses the same things the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openai_api.dispatch import dispatcher
from openai_api.mcp import loop as mcp_loop
from openai_api.output_tokens import limit_of
from openai_api.responses import protocol, store
from openai_api.responses.engine_events import EngineEvents
from openai_api.responses.fields import bad, new_id
from openai_api.responses.input_items import image_parts
from openai_api.responses.made_with import made_with
from openai_api.responses.remote_images import fetch_images
from openai_api.responses.translator import StreamTranslator

if TYPE_CHECKING:
    from collections.abc import Mapping

    from openai_api.catalog import Route


@dataclass
class Turn:
    """A create, checked and ready to run: what it continues from and its response."""

    route: Route
    identity: str
    request: protocol.ResponsesRequest
    history: list[dict[str, Any]]  # what it continues from (earlier turns, a conversation)
    translator: StreamTranslator

    @property
    def context(self) -> list[dict[str, Any]]:
        """Every input item of the response: what it continued from, then its own."""
        return [*self.history, *self.request.input_items]


async def prepare(
    route: Route,
    identity: str,
    data: dict[str, Any],
    known: Mapping[str, list[dict[str, Any]]] | None = None,
) -> Turn:
    """Check a create and resolve what it continues from. Everything refused here is
    refused before anything is written or the engine is called: a model that cannot serve
    now, a caller over quota, an unknown previous response or conversation."""
    request = protocol.parse(data)
    dispatcher.check_servable(route)
    if request.store or request.conversation:
        await store.run(store.check_quota, identity, request.background)
    if not route.sees_images and (images := image_parts(request.input_items)):
        raise bad(f"The model {route.name!r} does not take images ({images[0]} is one).", images[0])
    history = await store.earlier_items(identity, request, known)
    earlier = "conversation" if request.conversation else "previous_response_id"
    if not route.sees_images and image_parts(history):
        raise bad(
            f"The model {route.name!r} does not take images; earlier turns hold some.", earlier
        )
    if not route.reads_files:
        if files := image_parts(request.input_items, "input_file"):
            message = f"The model {route.name!r} does not read files ({files[0]} is one)."
            raise bad(message, files[0])
        if image_parts(history, "input_file"):
            raise bad(
                f"The model {route.name!r} does not read files; earlier turns hold some.", earlier
            )
    request.images = await fetch_images(request.input_items, history, earlier)
    response = protocol.envelope(request, new_id("resp"), int(time.time()), status="in_progress")
    response.update(made_with(request, route))  # what it is made with, not only what it asked
    translator: StreamTranslator
    if route.responses_by_engine:
        if request.uses_mcp:
            raise bad(
                f"MCP tools run in Modelship's own Responses; {route.name!r} passes"
                " /v1/responses to its engine (responses: engine).",
                "tools",
            )
        translator = EngineEvents(response)
    else:
        if request.uses_mcp:
            await mcp_loop.check(request, history)
        translator = StreamTranslator(response)
    translator.ceiling = limit_of(route)
    return Turn(route, identity, request, history, translator)
