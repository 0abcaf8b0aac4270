"""Every answer of an engine Modelship ships is JSON, its errors OpenAI-shaped.

aiohttp answers an exception in a handler with a plain-text 500 ("Server got itself in
trouble") and its own 404 and 405 with plain text too. The gateway passes an engine's errors
through unchanged, so a client sending a body the engine cannot read (an unknown charset,
`prompt: null`, a number where text belongs) saw a text 500 from Modelship. This middleware is
the one net under every handler of every shipped engine (common.engine_app adds it):

- what the client sent and the engine could not read (a charset Python has no codec for,
  bytes that are not the charset, a value of the wrong type or shape) is a 400;
- aiohttp's own HTTP errors (no such route, wrong method, body too large) keep their status
  with an OpenAI-shaped body;
- anything else is a JSON 500 that names no more than the exception's type.

A response that has already started (a stream) cannot be replaced: the exception goes on, and
aiohttp cuts the connection, which is how a broken stream ends anyway.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

log = logging.getLogger("modelship.engine")

# The kinds of exception that reading a request's body or its fields raises: a codec Python does
# not have (LookupError), bytes that are not the charset (UnicodeError, a ValueError), JSON that
# does not parse (ValueError), a field of another type or shape (TypeError, KeyError,
# AttributeError, IndexError).
UNREADABLE = (LookupError, ValueError, TypeError, AttributeError)
CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}
MESSAGE_LIMIT = 200


def error_body(message: str, code: str, type_: str) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": type_, "code": code, "param": None}}


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or request.get("started"):
            raise
        code = CODES.get(exc.status, "invalid_request" if exc.status < 500 else "internal_error")
        body = error_body(exc.reason, code, "invalid_request_error")
        return web.json_response(body, status=exc.status, headers=_kept(exc))
    except UNREADABLE as exc:
        if request.get("started"):
            raise
        detail = str(exc)[:MESSAGE_LIMIT] or type(exc).__name__
        message = f"The request could not be read: {detail}"
        return web.json_response(
            error_body(message, "invalid_request", "invalid_request_error"), status=400
        )
    except Exception as exc:  # the net under every handler: logged, answered as JSON
        if request.get("started"):
            raise
        log.exception("%s %s failed", request.method, request.path)
        message = f"The engine failed ({type(exc).__name__})."
        return web.json_response(error_body(message, "internal_error", "server_error"), status=500)


def _kept(exc: web.HTTPException) -> dict[str, str]:
    # A 405 says which methods the route takes.
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}


async def mark_started(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: from here on the response's head is out, so it cannot be replaced."""
    request["started"] = True


def install(app: web.Application) -> None:
    app.middlewares.append(json_errors)
    app.on_response_prepare.append(mark_started)
