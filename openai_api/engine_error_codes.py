"""Engines' error codes in OpenAI's words.

vLLM and llama.cpp answer an error as {"error": {"message", "type", "code": 400}}: the
HTTP status again, as a number (llama.cpp's `type` says more), where OpenAI's clients and
SDKs read a word (`context_length_exceeded`, `invalid_request`) or nothing. An error passed
on from an engine gets the word; an engine's own word stays as it is.
"""

from __future__ import annotations

import json
from typing import Any

# llama.cpp's error types, where they say more than the status.
BY_TYPE = {
    "exceed_context_size_error": "context_length_exceeded",
    "not_supported_error": "unsupported",
    "unavailable_error": "engine_unavailable",
}
BY_STATUS = {
    400: "invalid_request",
    401: "engine_unauthorized",
    403: "engine_forbidden",
    404: "not_found",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limit_exceeded",
    501: "unsupported",
    503: "engine_unavailable",
}
CONTEXT_WORDS = ("maximum context length", "context length", "exceeds the available context")


def is_number(code: Any) -> bool:
    if isinstance(code, bool):
        return False
    return isinstance(code, int) or (isinstance(code, str) and code.strip().isdecimal())


def openai_code(status: int, error: dict[str, Any]) -> str | None:
    """The code a client reads for an engine's error: the engine's own where it is a word,
    else one from its type, its message (a prompt past the context) or the status."""
    code = error.get("code")
    if code not in (None, "") and not is_number(code):
        return str(code)
    kind = error.get("type")
    if isinstance(kind, str) and kind in BY_TYPE:
        return BY_TYPE[kind]
    message = str(error.get("message", "")).lower()
    if status == 400 and any(words in message for words in CONTEXT_WORDS):
        return "context_length_exceeded"
    if code in (None, ""):
        return None
    return BY_STATUS.get(status, "engine_error" if status >= 500 else "upstream_error")


def normalized(status: int, raw: bytes) -> bytes | None:
    """An engine's OpenAI-shaped error body with its numeric code made a word; None where
    there is nothing to change (not JSON, no error object, a word already)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not is_number(error.get("code")):
        return None
    error["code"] = openai_code(status, error)
    return json.dumps(body).encode()
