"""What /api answers when Django, not DRF, answers: a path no route matches (an id with a
dot or a slash, a misspelled action) and an error outside a view. JSON in DRF's {detail}
shape, never Django's HTML page; the admin and the rest of the site keep Django's pages.

Named in urls.py as handler404 and handler500, which Django calls only with DEBUG off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpResponse, JsonResponse
from django.views import defaults

if TYPE_CHECKING:
    from django.http import HttpRequest

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX) or request.path_info == API_PREFIX[:-1]


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return JsonResponse({"detail": "Not found.", "code": "not_found"}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        body = {"detail": "Internal server error.", "code": "server_error"}
        return JsonResponse(body, status=500)
    return defaults.server_error(request)
