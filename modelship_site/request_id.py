"""A request id on every request and response, readable by the audit log."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

current_request_id: ContextVar[str] = ContextVar("current_request_id", default="")

_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def make_request_id(incoming: str | None) -> str:
    """Keep a caller's id when it is sane, so logs correlate across a proxy; else make one."""
    if incoming and _VALID.match(incoming):
        return incoming
    return os.urandom(16).hex()  # as random as a uuid4, at a fraction of the cost


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = make_request_id(request.headers.get("X-Request-Id"))
        token = current_request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response["X-Request-Id"] = request_id
        return response
