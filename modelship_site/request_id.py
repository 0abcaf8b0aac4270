"""The middleware that gives every Django request and response a request id (the audit log
reads it from common.request_id)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.request_id import current_request_id, make_request_id

if TYPE_CHECKING:
    from collections.abc import Callable

    from django.http import HttpRequest, HttpResponse


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
