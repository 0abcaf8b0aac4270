"""Checks of the Responses and Conversations APIs' common fields: ids, metadata, paging,
the conversation a request names; a field that fails is a 400 naming it."""

from __future__ import annotations

import secrets
from typing import Any

from openai_api.errors import GatewayError


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request", param=param)


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def page_of(query: dict[str, str]) -> tuple[str, str | None, int]:
    """A list's paging query: its order (newest first by default), the id it starts
    after and how many items (1 to 100, 20 by default)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad("'order' is asc or desc.", "order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad("'limit' is 1 to 100.", "limit")
    return order, query.get("after"), limit


def metadata_of(value: Any) -> dict[str, str]:
    """`metadata`: at most 16 string keys of up to 64 characters, values of up to 512."""
    metadata = value or {}
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise bad("'metadata' must be an object of at most 16 keys.", "metadata")
    for key, item in metadata.items():
        if len(str(key)) > 64 or len(str(item)) > 512:
            raise bad("'metadata' keys are at most 64 characters, values 512.", "metadata")
    return {str(k): str(v) for k, v in metadata.items()}


def conversation_id(value: Any) -> str | None:
    """`conversation`: an id, or an object with one."""
    if isinstance(value, dict):
        value = value.get("id")
        if not isinstance(value, str):
            raise bad("'conversation.id' must be a string.", "conversation.id")
    if value is not None and (not isinstance(value, str) or not value):
        raise bad("'conversation' must be a conversation id or {id}.", "conversation")
    return value
