"""GET /metrics: Modelship's own metrics in the Prometheus text format.

Summed over every process of the site (common/metrics.py says how they record), with what
the control plane knows at scrape time (deployments/metrics_collector.py). Open to the
addresses MSHIP_METRICS_ALLOW lists (loopback by default: a Prometheus on the host); from
elsewhere it needs an /api token (or a signed-in session) of a user who may view
deployments, as the API does.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from common.networks import networks
from deployments.api.tokens import user_of_token
from deployments.metrics_collector import ControlPlaneCollector
from modelship_site.metrics_series import prepare_known_series
from modelship_site.metrics_token import has_metrics_token

if TYPE_CHECKING:
    from django.http import HttpRequest

VIEW_DEPLOYMENTS = "deployments.view_deployment"


def metrics(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return refusal(405, f"{request.method} is not allowed on /metrics.")
    allowed = from_allowed_address(request) or has_metrics_token(request)
    if not allowed and not may_view(request):
        return refusal(
            401,
            "Metrics need MSHIP_METRICS_TOKEN (Authorization: Bearer …), an /api token"
            " (Authorization: Token …) of a user who may view deployments, or a request from"
            " an address in MSHIP_METRICS_ALLOW.",
        )
    prepare_known_series()  # every deployment's series, at 0 until its first event
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(settings.MSHIP_METRICS_DIR))  # type: ignore[no-untyped-call]
    registry.register(ControlPlaneCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def fresh_metrics() -> None:
    """`serve`'s start: counters begin at zero, and nothing an earlier run's processes left
    is summed."""
    for left in Path(settings.MSHIP_METRICS_DIR).glob("*.db"):
        left.unlink(missing_ok=True)


def process_gone(pid: int) -> None:
    """A process of the site exited: its live gauges (in flight, queued) stop counting."""
    mark_process_dead(pid, str(settings.MSHIP_METRICS_DIR))  # type: ignore[no-untyped-call]


def from_allowed_address(request: HttpRequest) -> bool:
    try:
        peer = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(peer in network for network in networks(settings.MSHIP_METRICS_ALLOW))


def may_view(request: HttpRequest) -> bool:
    user: Any = request.user
    if not user.is_authenticated:
        user = user_of_token(request)  # the /api token, hashed and throttled as there
        if user is None:
            return False
    return bool(user.is_active and user.is_staff and user.has_perm(VIEW_DEPLOYMENTS))


def refusal(status: int, message: str) -> HttpResponse:
    code = "unauthorized" if status == 401 else "method_not_allowed"
    body = {"detail": message, "code": code}
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    if status == 401:
        response["WWW-Authenticate"] = "Token"
    return response
