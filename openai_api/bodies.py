"""Reading what a caller sent: JSON with a bounded nesting depth, and multipart forms.

A body nested a thousand levels deep makes Python's JSON reader (and every recursive walk
after it) raise RecursionError; such a body is refused with a 400 before it is parsed.
MAX_DEPTH is far beyond any OpenAI request (a tool's JSON schema is the deepest part, and
OpenAI itself caps those at 10 levels).

Every reading here is linear in the body's size, whatever the body: a caller must not be able
to buy seconds of the event loop with a few kilobytes (the depth scan's first pattern retried
from every quote of an unterminated string, 3 s for 32 KB; a form part in punycode decodes in
quadratic time).
"""

from __future__ import annotations

import asyncio
import encodings
import encodings.aliases
import json
import re
from email.message import Message
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar

from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")
MAX_DEPTH = 64
INLINE_PARSE_BYTES = 64 * 1024  # parsed on the event loop up to this size, else in a thread
# A JSON string, closed or not (an unterminated one runs to the end of the body). It cannot
# fail once it starts at a quote and never gives back what it took, so removing every string
# is one pass over the body.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
# What is left once strings are gone: brackets as signed steps (+1 opens, -1 closes), the
# rest deleted.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


async def parsed(
    parse: Callable[[str, bytes], T], content_type: str, body: bytes, *, heavy: bool = False
) -> T:
    """`parse(content_type, body)`: on the event loop for a small body, in a thread for a
    big one or one the caller knows is costly (`heavy`), so other streams keep flowing."""
    if heavy or len(body) > INLINE_PARSE_BYTES:
        return await asyncio.to_thread(parse, content_type, body)
    return parse(content_type, body)


async def json_bytes(value: Any, size: int) -> bytes:
    """`value` as JSON text, made as `parsed` reads: in a thread where it came from a big
    body (`size` bytes)."""
    if size > INLINE_PARSE_BYTES:
        return await asyncio.to_thread(lambda: json.dumps(value).encode())
    return json.dumps(value).encode()


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests deeper than `limit` (read without parsing it, in time
    linear in its size: a few passes in C, no Python bytecode per byte)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the usual case, answered by two C-speed counts
    steps = _STRING.sub(b"", body).translate(_STEPS, _NOT_BRACKETS)
    if steps.count(1) <= limit:
        return False  # the brackets were inside strings
    # The depth after each bracket is the running sum of the steps.
    return max(accumulate(memoryview(steps).cast("b"))) > limit


def json_value(body: bytes) -> Any:
    """The body's JSON value; 400 invalid_json when it is not JSON or nests too deep."""
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        # Read as the parser reads it: in UTF-16 or UTF-32 a character's bytes may hold a
        # quote or a backslash (U+5C41 is 41 5C), and the scan would lose track of strings.
        try:
            body = body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
        except UnicodeError as exc:
            raise GatewayError(400, f"The body is not valid JSON: {exc}.", "invalid_json") from exc
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
    read (no boundary, a part in an unknown charset, a nested multipart part).

    A scan for the part by its boundary, not a full MIME parse: the standard library's
    parser takes 20 s of CPU for a 16 MiB form of 300,000 empty parts; this takes a
    fraction of a second and gives up after MAX_PARTS parts. The field given twice is a 400:
    the gateway would judge one `model` and the engine serve the other."""
    invalid = GatewayError(400, "The body is not a readable multipart form.", "invalid_form")
    boundary = header_params(content_type).get("boundary", "")
    if not boundary or len(boundary) > 200:
        raise invalid
    delimiter = b"--" + boundary.encode("latin-1")
    pos = body.find(delimiter)
    if pos < 0:
        raise invalid
    found: str | None = None
    for _ in range(MAX_PARTS):
        start = pos + len(delimiter)
        if body[start : start + 2] == b"--":
            return found  # the closing delimiter
        headers_end = body.find(b"\r\n\r\n", start)
        following = body.find(b"\r\n" + delimiter, headers_end)
        if headers_end < 0 or following < 0 or headers_end - start > MAX_PART_HEADER_BYTES:
            raise invalid
        block = body[start:headers_end]
        if name.encode() in block:  # a candidate: read its headers properly
            headers = part_headers(block)
            disposition = header_params(headers.get("content-disposition", ""))
            if disposition.get("name") == name:
                part_type = headers.get("content-type", "text/plain")
                if part_type.lower().startswith("multipart/"):
                    raise invalid
                if found is not None:
                    raise GatewayError(
                        400, f"The form gives '{name}' more than once.", "invalid_form", param=name
                    )
                codec = form_codec(header_params(part_type).get("charset", "utf-8"), name)
                try:
                    found = body[headers_end + 4 : following].decode(codec)
                except UnicodeError as exc:
                    raise invalid from exc
        pos = following + 2
    raise GatewayError(400, f"The form has more than {MAX_PARTS} parts.", "invalid_form")


# The charsets clients send a form's text in (the SDKs, curl and browsers send UTF-8, or no
# charset), as Python names their codecs. Any other is refused unread: some codecs decode in
# quadratic time (punycode: 200 KB took 13 s), and none is needed for a model's name.
FORM_CODECS = frozenset({"utf_8", "ascii", "latin_1"})


def form_codec(charset: str, field: str) -> str:
    """The codec of a part's charset, under any of its spellings (UTF8, us-ascii,
    ISO_8859-1...); 400 invalid_form for any other charset."""
    normalized = encodings.normalize_encoding(charset.strip().lower())
    codec = encodings.aliases.aliases.get(normalized, normalized)
    if codec not in FORM_CODECS:
        raise GatewayError(
            400,
            f"The form's '{field}' is in charset {charset[:40]!r}; send it in utf-8,"
            " us-ascii or iso-8859-1.",
            "invalid_form",
            param=field,
        )
    return codec


MAX_PART_HEADER_BYTES = 8192
MAX_PARTS = 1000  # an audio or image upload has a handful


def part_headers(block: bytes) -> dict[str, str]:
    """A part's header block as lower-case names to values."""
    headers = {}
    for line in block.decode("latin-1").split("\r\n"):
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    return headers


def header_params(value: str) -> dict[str, str]:
    """The parameters of a header value (`form-data; name="model"`), names lower-cased."""
    message = Message()
    message["content-type"] = value
    params = message.get_params(header="content-type") or []
    return {str(k).lower(): str(v) for k, v in params[1:]}
