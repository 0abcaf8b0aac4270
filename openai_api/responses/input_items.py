"""A Responses request's `input` (and a conversation's `items`): checked, normalised to
typed items, each with an id, and its function call outputs matched to calls."""

from __future__ import annotations

import json
from typing import Any

from openai_api.responses.fields import bad, new_id

IMAGE_URLS = ("http://", "https://", "data:image/")


def check_tool_outputs(history: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
    """Each function_call_output answers a function call of the conversation (earlier
    turns or this input): one for a call_id nobody made is a 400 naming it, not an engine
    error later."""
    made = {i.get("call_id") for i in [*history, *items] if i.get("type") == "function_call"}
    for index, item in enumerate(items):
        if item.get("type") == "function_call_output" and item.get("call_id") not in made:
            raise bad(
                f"No function call with call_id {item.get('call_id')!r} in this conversation.",
                f"input[{index}].call_id",
            )


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's input as items, each with an id (input_items lists them by it)."""
    if value is None:
        raise bad("'input' is required.", "input")
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad("'input' must be a string or a list of items.", "input")
    items = []
    for index, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise bad(f"input[{index}] must be an object.", f"input[{index}]")
        item = dict(raw)
        kind = item.setdefault("type", "message")
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                raise bad(f"input[{index}] needs a role.", f"input[{index}].role")
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if item["role"] == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": content}]
            elif not isinstance(content, list) or not all(
                isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
            ):
                raise bad(
                    f"input[{index}].content must be text or a list of typed parts.",
                    f"input[{index}].content",
                )
            else:
                for number, part in enumerate(content):
                    check_part(part, f"input[{index}].content[{number}]")
            item.setdefault("id", new_id("msg"))
            item.setdefault("status", "completed")
        elif kind == "function_call":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise bad(f"input[{index}] needs call_id and name.", f"input[{index}]")
            if not isinstance(item.setdefault("arguments", "{}"), str):
                raise bad(f"input[{index}].arguments must be a string.", f"input[{index}]")
            item.setdefault("id", new_id("fc"))
            item.setdefault("status", "completed")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                raise bad(f"input[{index}] needs call_id.", f"input[{index}].call_id")
            output = item.get("output")
            if not isinstance(output, str):
                item["output"] = json.dumps(output)
            item.setdefault("id", new_id("fco"))
            item.setdefault("status", "completed")
        elif kind == "reasoning":
            item.setdefault("id", new_id("rs"))
        elif kind == "compaction":  # made by /v1/responses/compact (compaction.py checks it)
            if not isinstance(item.get("encrypted_content"), str) or not item["encrypted_content"]:
                raise bad(
                    f"input[{index}] needs encrypted_content.", f"input[{index}].encrypted_content"
                )
            item.setdefault("id", new_id("cmp"))
        elif kind == "mcp_approval_response":
            if not isinstance(item.get("approval_request_id"), str) or not isinstance(
                item.get("approve"), bool
            ):
                raise bad(
                    f"input[{index}] needs approval_request_id and approve.", f"input[{index}]"
                )
            item.setdefault("id", new_id("mcpa"))
        elif kind in ("mcp_call", "mcp_list_tools", "mcp_approval_request"):
            # An earlier output, passed back: a call must say what ran and what came of it.
            if kind != "mcp_list_tools" and not (
                isinstance(item.get("name"), str)
                and isinstance(item.get("arguments", "{}"), str)
                and isinstance(item.get("output") or "", str)
                and isinstance(item.get("error") or {}, dict | str)
            ):
                raise bad(
                    f"input[{index}] needs a name and string arguments and output.",
                    f"input[{index}]",
                )
            item.setdefault("id", new_id("mcp"))
        else:
            raise bad(f"input[{index}] has an unknown type {kind!r}.", f"input[{index}].type")
        items.append(item)
    return items


def check_part(part: dict[str, Any], param: str) -> None:
    """An image or a file part carries its data itself (a URL or a data URL for an image,
    a data URL for a file): there is no file store here for an id to name."""
    kind = part["type"]
    if kind == "input_image":
        url = part.get("image_url")
        if part.get("file_id") or not isinstance(url, str) or not url.startswith(IMAGE_URLS):
            raise bad(
                "An input_image needs image_url: an http(s) URL or a data: URL (file ids are"
                " not available here).",
                param,
            )
        if part.get("detail", "auto") not in ("auto", "low", "high"):
            raise bad("'detail' is auto, low or high.", f"{param}.detail")
    elif kind == "input_file":
        data = part.get("file_data")
        if part.get("file_id") or part.get("file_url") or not isinstance(data, str) or not data:
            raise bad(
                "An input_file needs file_data (a data: URL, with a filename); file ids and"
                " file URLs are not available here.",
                param,
            )


def image_parts(items: list[dict[str, Any]], kind: str = "input_image") -> list[str]:
    """Where the items hold images (or parts of another `kind`: input_file), as the params
    that name them."""
    return [
        f"input[{index}].content[{number}]"
        for index, item in enumerate(items)
        if item.get("type", "message") == "message" and isinstance(item.get("content"), list)
        for number, part in enumerate(item["content"])
        if isinstance(part, dict) and part.get("type") == kind
    ]
