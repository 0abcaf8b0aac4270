"""API errors: DRF's field errors for bad input; a refused operation as its status, detail
and code (with its figures: the shortfall of a memory refusal, the state of a wrong one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ObjectDoesNotExist
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError
from rest_framework.views import exception_handler as drf_exception_handler

from deployments.refusals import OperationRefused

if TYPE_CHECKING:
    from rest_framework.response import Response


class Refused(APIException):
    def __init__(self, exc: OperationRefused) -> None:
        super().__init__(str(exc), exc.code)
        self.status_code = exc.status
        self.extra = {"code": exc.code, **exc.extra()}


def as_api_exception(exc: OperationRefused) -> APIException:
    """Field refusals keep DRF's shape ({field: [message]}): 400 for bad values, 403 for
    fields the user may not set; the others answer {detail, code, ...}."""
    if exc.fields and exc.status == 400:
        return ValidationError(exc.fields, exc.code)
    if exc.fields and exc.status == 403:
        return PermissionDenied(exc.fields, exc.code)
    return Refused(exc)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, OperationRefused):
        exc = as_api_exception(exc)
    elif isinstance(exc, ObjectDoesNotExist):
        # A row read again after another request removed it (a DELETE racing an action):
        # the object is gone, which is a 404, not an error of the server.
        exc = NotFound()
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, Refused):
        response.data = {"detail": str(exc.detail), **exc.extra}
    return response
