"""The input checks a real engine makes before it generates, for the engines Modelship ships.

The simulated engine stands in for vLLM in tests and dry runs, so it must refuse what vLLM
refuses (a 400 naming the field) instead of failing with a 500 on a wrong type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(v) for v in value)


def is_message(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("role"), str):
        return False
    content = value.get("content")
    return (
        content is None
        or isinstance(content, str)
        or (isinstance(content, list) and all(is_part(p) for p in content))
    )


def is_part(value: Any) -> bool:
    """A content part: an object with a type; a text part's text is a string."""
    if not isinstance(value, dict) or not isinstance(value.get("type", ""), str):
        return False
    return value.get("type") != "text" or isinstance(value.get("text"), str)


def is_tool(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    function = value.get("function", value)  # chat's {function: {...}} or Anthropic's flat
    return isinstance(function, dict) and isinstance(function.get("name"), str)


COMMON: dict[str, tuple[Check, str]] = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "max_tokens": (lambda v: is_int(v) and v >= 0, "a non-negative integer"),
    "max_completion_tokens": (lambda v: is_int(v) and v >= 0, "a non-negative integer"),
    "n": (lambda v: is_int(v) and v >= 1, "a positive integer"),
    "temperature": (is_number, "a number"),
    "top_p": (is_number, "a number"),
    "stop": (lambda v: isinstance(v, str) or is_str_list(v), "a string or a list of strings"),
    "tools": (lambda v: isinstance(v, list) and all(is_tool(t) for t in v), "a list of tools"),
}
BY_PATH: dict[str, dict[str, tuple[Check, str]]] = {
    "/v1/chat/completions": {
        "messages": (
            lambda v: isinstance(v, list) and all(is_message(m) for m in v),
            "a list of messages with a role",
        ),
    },
    "/v1/messages": {
        "messages": (
            lambda v: isinstance(v, list) and all(is_message(m) for m in v),
            "a list of messages with a role",
        ),
        "system": (lambda v: isinstance(v, str | list), "a string or a list of blocks"),
    },
    "/v1/completions": {
        "prompt": (
            lambda v: isinstance(v, str) or is_str_list(v) or is_int_list(v),
            "a string, a list of strings or a list of token ids",
        ),
    },
    "/v1/embeddings": {
        "input": (
            lambda v: (
                isinstance(v, str)
                or is_str_list(v)
                or is_int_list(v)
                or (isinstance(v, list) and all(is_int_list(i) for i in v))
            ),
            "a string, a list of strings or token ids",
        ),
    },
}
# Required, and not null: vLLM refuses `prompt: null` as it refuses a missing prompt.
REQUIRED = {
    "/v1/chat/completions": "messages",
    "/v1/messages": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
}


def problem(path: str, body: dict[str, Any]) -> tuple[str, str] | None:
    """(the field, what is wrong with it) for a request a real engine would refuse."""
    required = REQUIRED.get(path)
    if required is not None and body.get(required) is None:
        return required, f"'{required}' is required."
    for name, (check, expected) in {**COMMON, **BY_PATH.get(path, {})}.items():
        if name in body and body[name] is not None and not check(body[name]):
            return name, f"'{name}' must be {expected}."
    return None
