"""Server-side MCP tools: one response, many engine turns, stitched into one stream.

A request with `{"type": "mcp", ...}` tools is driven here instead of by a single engine
call: list each server's tools, offer them to the model as plain function tools, run a
turn, execute the MCP calls it made, feed their results back, and loop, up to MAX_TURNS
(or `max_tool_calls` calls), until the model answers, calls a client's own function tool
(handed back unresolved), or wants a call that needs approval. One translator spans every
turn, so the client sees one `response.created`, one terminal event, and sequence numbers
and output indexes that only grow.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from django.conf import settings

from openai_api.engine_dialect import chat_body
from openai_api.errors import GatewayError
from openai_api.mcp import egress
from openai_api.mcp.client import Connection, McpFailure, McpServer, McpTool
from openai_api.responses import protocol
from openai_api.responses.engine_turn import Emit, generate
from openai_api.responses.image_urls import inlined

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.responses.protocol import ResponsesRequest
    from openai_api.responses.translator import Item, StreamTranslator

MAX_TURNS = 10
NOT_APPROVED = "The user did not approve this call."


def servers_of(request: ResponsesRequest) -> list[McpServer]:
    return [McpServer.of(tool) for tool in request.tools if tool.get("type") == "mcp"]


def approvals_of(request: ResponsesRequest) -> list[dict[str, Any]]:
    return [i for i in request.input_items if i.get("type") == "mcp_approval_response"]


async def check(request: ResponsesRequest, history: list[dict[str, Any]]) -> None:
    """Before any engine work: every server allowed by the egress policy, every approval
    answering a request this conversation really holds, once (no forged approvals)."""
    servers = servers_of(request)
    for server in servers:
        await egress.check(server.url)
    asked = {i["id"]: i for i in history if i.get("type") == "mcp_approval_request"}
    answered = {
        i.get("approval_request_id")
        for i in history
        if i.get("type") in ("mcp_approval_response", "mcp_call")
    }
    labels = {server.label for server in servers}
    for approval in approvals_of(request):
        request_id = approval["approval_request_id"]
        if request_id not in asked or request_id in answered:
            raise GatewayError(
                400,
                f"{request_id!r} is no pending approval request of this conversation.",
                "invalid_request",
                param="input",
            )
        if asked[request_id]["server_label"] not in labels:
            raise GatewayError(
                400,
                f"The approved call's server {asked[request_id]['server_label']!r} is not"
                " among this request's MCP tools.",
                "invalid_request",
                param="tools",
            )


def card(tool: McpTool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "annotations": tool.annotations,
    }


async def run(
    route: Route,
    request: ResponsesRequest,
    history: list[dict[str, Any]],
    translator: StreamTranslator,
    emit: Emit,
    request_id: str,
) -> bool:
    """The whole loop; False when the response failed (its failure already emitted)."""
    connections: dict[str, Connection] = {}
    offered = await list_tools(servers_of(request), connections, translator, emit)
    if offered is None:
        return False
    translator.mcp_tools = {name: server.label for name, (server, _) in offered.items()}
    translator.mcp_approval = {
        name for name, (server, tool) in offered.items() if server.needs_approval(tool)
    }
    items = [i for i in request.input_items if i.get("type") != "mcp_approval_response"]
    messages = protocol.messages(request.instructions, inlined([*history, *items], request.images))
    asked = {i["id"]: i for i in history if i.get("type") == "mcp_approval_request"}
    for approval in approvals_of(request):
        asked_item = asked[approval["approval_request_id"]]
        messages += await run_approved(asked_item, approval, connections, translator, emit)
    body = protocol.chat_request(request, [])
    body["tools"] = [*mcp_function_tools(offered), *protocol.function_tools(request.tools)]
    body = chat_body(route, body)
    budget = request.raw.get("max_tool_calls") or float("inf")
    for _ in range(MAX_TURNS):
        body["messages"] = messages
        if not await generate(route, body, translator, emit, request_id):
            return False
        calls = translator.turn_calls()
        closing, pending = translator.end_turn()
        await emit(closing)
        runnable = [item for item in pending if item.kind == "mcp_call"]
        if not runnable:
            break  # an answer, client function calls, or calls awaiting approval
        for item in runnable:
            output, error = await execute(connections[item.fields["server_label"]], item)
            await emit(translator.finish_mcp_call(item, output, error))
            messages += protocol.mcp_exchange(
                item.fields["call_id"],
                item.fields["name"],
                item.text or "{}",
                protocol.tool_text({"output": output, "error": error}),
            )
            budget -= 1
        if len(runnable) < len(calls) or budget <= 0:
            break  # the client's own calls go back to it; or the budget is spent
    return True


async def list_tools(
    servers: list[McpServer],
    connections: dict[str, Connection],
    translator: StreamTranslator,
    emit: Emit,
) -> dict[str, tuple[McpServer, McpTool]] | None:
    """Each server's tools (those it allows), as mcp_list_tools items; None when a server
    could not be listed (the response failed). The servers are listed side by side, all
    within one deadline (MSHIP_MCP_LIST_TIMEOUT_S, however many there are: this is before
    any engine work), their items emitted in the request's order."""
    limit = float(settings.MSHIP_MCP_LIST_TIMEOUT_S)
    deadline = asyncio.get_running_loop().time() + limit
    listing = [(server, Connection(server)) for server in servers]
    tasks = [asyncio.create_task(connection.open()) for _, connection in listing]
    offered: dict[str, tuple[McpServer, McpTool]] = {}
    try:
        for (server, connection), task in zip(listing, tasks, strict=True):
            item, events = translator.open_list_tools(server.label)
            await emit(events)
            try:
                async with asyncio.timeout_at(deadline):  # the wait only: not the emits
                    tools = await task
            except TimeoutError:
                late = (
                    "its tools were not listed in time (a request's MCP servers are all"
                    f" listed within {limit:g} s)"
                )
                failure = McpFailure(late, {"type": "http_error", "code": 504, "message": late})
            except McpFailure as exc:
                failure = exc
            else:
                connections[server.label] = connection
                visible = [tool for tool in tools if server.allows(tool)]
                await emit(translator.finish_list_tools(item, [card(tool) for tool in visible]))
                for tool in visible:
                    offered.setdefault(tool.name, (server, tool))
                continue
            await emit(translator.finish_list_tools(item, [], error=str(failure)))
            await emit(
                translator.fail(
                    "mcp_list_tools_failed", f"The MCP server {server.label!r} failed: {failure}"
                )
            )
            return None
    finally:
        # Those not waited for (one before them failed, or the client went away) stop.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return offered


def mcp_function_tools(offered: dict[str, tuple[McpServer, McpTool]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
            },
        }
        for _, tool in offered.values()
    ]


async def execute(connection: Connection, item: Item) -> tuple[str | None, dict[str, Any] | None]:
    name = item.fields["name"]
    try:
        arguments = json.loads(item.text or "{}")
        if not isinstance(arguments, dict):
            raise ValueError("not an object")
    except ValueError:
        message = f"The model's arguments for {name} are not a JSON object."
        return None, {"type": "mcp_protocol_error", "code": -32602, "message": message}
    try:
        return await connection.call(name, arguments), None
    except McpFailure as exc:
        return None, exc.error


async def run_approved(
    asked: dict[str, Any],
    approval: dict[str, Any],
    connections: dict[str, Connection],
    translator: StreamTranslator,
    emit: Emit,
) -> list[dict[str, Any]]:
    """An answered approval request: the call run (or not) and what the model is told."""
    call_id = asked["id"]
    if not approval["approve"]:
        return protocol.mcp_exchange(call_id, asked["name"], asked["arguments"], NOT_APPROVED)
    item, events = translator.open_mcp_call(
        asked["server_label"], asked["name"], asked["arguments"], asked["id"]
    )
    await emit(events)
    output, error = await execute(connections[asked["server_label"]], item)
    await emit(translator.finish_mcp_call(item, output, error))
    result = protocol.tool_text({"output": output, "error": error})
    return protocol.mcp_exchange(item.fields["call_id"], asked["name"], asked["arguments"], result)
