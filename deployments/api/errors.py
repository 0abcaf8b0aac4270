"""API errors: DRF's field errors for bad input, a code and detail for conflicts."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from deployments.memory import InsufficientMemory


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, detail: str, code: str, **extra: Any) -> None:
        super().__init__(detail, code)
        self.extra = {"code": code, **extra}


def insufficient_memory(exc: InsufficientMemory) -> Conflict:
    return Conflict(
        str(exc),
        "insufficient_memory",
        shortfall_gib=exc.shortfall_gib,
        need_gib=exc.need_gib,
        free_gib=exc.free_gib,
        capacity_gib=exc.capacity_gib,
    )


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, InsufficientMemory):
        exc = insufficient_memory(exc)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, Conflict):
        response.data = {"detail": str(exc.detail), **exc.extra}
    return response
