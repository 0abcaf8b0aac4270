"""/metrics for a scraper that is not on an allowed address: a bearer token of its own.

MSHIP_METRICS_TOKEN is a secret the site gives its Prometheus (`authorization: {type:
Bearer, credentials: ...}` in its scrape config), so a scraper elsewhere needs no staff user
and no /api token. Compared in constant time; empty (the default) turns it off.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from django.http import HttpRequest


def has_metrics_token(request: HttpRequest) -> bool:
    expected = settings.MSHIP_METRICS_TOKEN
    if not expected:
        return False
    scheme, _, offered = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(offered.strip().encode(), expected.encode())
