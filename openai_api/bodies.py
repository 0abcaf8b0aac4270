"""Reading what a caller sent: JSON with a bounded nesting depth, and multipart forms.

A body nested a thousand levels deep makes Python's JSON reader (and every recursive walk
after it) raise RecursionError; such a body is refused with a 400 before it is parsed.
MAX_DEPTH is far beyond any OpenAI request (a tool's JSON schema is the deepest part, and
OpenAI itself caps those at 10 levels).
"""

from __future__ import annotations

import json
import re
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from openai_api.errors import GatewayError

MAX_DEPTH = 64
# A JSON string (skipped whole, so brackets inside it do not count) or a bracket.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests deeper than `limit` (read without parsing it)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the usual case, answered by two C-speed counts
    depth = 0
    for match in _TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def json_value(body: bytes) -> Any:
    """The body's JSON value; 400 invalid_json when it is not JSON or nests too deep."""
    if too_deep(body):
        raise GatewayError(
            400, f"The JSON body nests deeper than {MAX_DEPTH} levels.", "invalid_json"
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise GatewayError(400, f"The body is not valid JSON: {exc}.", "invalid_json") from exc


def form_field(content_type: str, body: bytes, name: str) -> str | None:
    """One text field of a multipart/form-data body; 400 invalid_form when it cannot be
    read (no boundary, a part in an unknown charset, a nested multipart part)."""
    invalid = GatewayError(400, "The body is not a readable multipart form.", "invalid_form")
    try:
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        if not message.is_multipart() or message.defects:
            raise invalid
        for part in message.iter_parts():
            assert isinstance(part, Message)
            if part.get_param("name", header="content-disposition") != name:
                continue
            if part.is_multipart():
                raise invalid
            payload = part.get_payload(decode=True)
            if not isinstance(payload, bytes):
                raise invalid
            return payload.decode(part.get_content_charset() or "utf-8")
    except (LookupError, UnicodeError, ValueError, TypeError, AssertionError) as exc:
        raise invalid from exc
    return None
