"""The output of a Responses request: one engine turn, or the MCP loop's many."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openai_api.cache_scope import with_cache_salt
from openai_api.engine_dialect import chat_body
from openai_api.mcp import loop as mcp_loop
from openai_api.responses import protocol
from openai_api.responses.engine_events import engine_request
from openai_api.responses.engine_turn import Emit, generate

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.responses.translator import StreamTranslator


async def respond(
    route: Route,
    request: protocol.ResponsesRequest,
    history: list[dict[str, Any]],
    translator: StreamTranslator,
    emit: Emit,
    request_id: str,
) -> bool:
    """The response's output: one engine turn, or the MCP loop's many."""
    if request.uses_mcp:
        return await mcp_loop.run(route, request, history, translator, emit, request_id)
    if route.responses_by_engine:
        body = with_cache_salt(route, engine_request(request, history))
    else:
        body = chat_body(route, protocol.chat_request(request, history))
    return await generate(route, body, translator, emit, request_id)
