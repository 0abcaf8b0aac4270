"""/v1/conversations: create, retrieve, update (its metadata) and delete a conversation;
list, add, retrieve and delete its items. OpenAI's shapes and limits (20 items to an add,
pages of 1 to 100 items, newest first unless `order=asc`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from openai_api.bodies import json_value, parsed
from openai_api.errors import GatewayError
from openai_api.responses import conversations, fields, store
from openai_api.responses.input_items import input_items

if TYPE_CHECKING:
    from openai_api.exchange import Exchange


async def handle(
    exchange: Exchange, identity: str, method: str, parts: list[str], query: dict[str, str]
) -> None:
    """`parts`: the path after /v1/conversations, split on '/'."""
    conversation_id, rest = (parts[0], parts[1:]) if parts else ("", [])
    if not conversation_id and method == "POST":
        data = await body_of(exchange)
        metadata = fields.metadata_of(data.get("metadata"))
        items = items_of(data, required=False)
        return await answer(exchange, conversations.create, identity, metadata, items)
    if not conversation_id or len(rest) > 2 or (rest and rest[0] != "items"):
        raise GatewayError(404, f"Unknown path {exchange.scope['path']}.", "not_found")
    if not rest:
        if method == "GET":
            return await answer(exchange, conversations.public_of, identity, conversation_id)
        if method == "POST":
            data = await body_of(exchange)
            if "metadata" not in data:
                raise fields.bad("'metadata' is required.", "metadata")
            metadata = fields.metadata_of(data["metadata"])
            return await answer(exchange, conversations.update, identity, conversation_id, metadata)
        if method == "DELETE":
            return await answer(exchange, conversations.delete, identity, conversation_id)
    elif len(rest) == 1:
        if method == "GET":
            order, after, limit = fields.page_of(query)
            return await answer(
                exchange, conversations.list_items, identity, conversation_id, order, after, limit
            )
        if method == "POST":
            items = items_of(await body_of(exchange), required=True)
            return await answer(exchange, conversations.add_items, identity, conversation_id, items)
    else:
        item_id = rest[1]
        if method == "GET":
            return await answer(exchange, conversations.item, identity, conversation_id, item_id)
        if method == "DELETE":
            return await answer(
                exchange, conversations.delete_item, identity, conversation_id, item_id
            )
    raise GatewayError(
        405, f"{method} is not allowed on {exchange.scope['path']}.", "method_not_allowed"
    )


async def answer(exchange: Exchange, fn: Any, *args: Any) -> None:
    await exchange.json(200, json.dumps(await store.run(fn, *args)).encode())


async def body_of(exchange: Exchange) -> dict[str, Any]:
    body = await exchange.read_body()
    return await parsed(json_object, exchange.headers.get("content-type", ""), body)


def json_object(content_type: str, body: bytes) -> dict[str, Any]:
    """A body's JSON object ({} for none), read as every /v1 body is (bodies.parsed)."""
    data = json_value(body) if body.strip() else {}
    if not isinstance(data, dict):
        raise GatewayError(400, "The body must be a JSON object.", "invalid_request")
    return data


def items_of(data: dict[str, Any], required: bool) -> list[dict[str, Any]]:
    """`items`, checked as Responses input items (each given an id)."""
    value = data.get("items")
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise fields.bad("'items' must be a list of items.", "items")
    try:
        return input_items(value)
    except GatewayError as exc:  # named as `items[n]`, not `input[n]`
        raise fields.bad(
            exc.message.replace("input[", "items["),
            (exc.param or "items").replace("input", "items"),
        ) from exc
