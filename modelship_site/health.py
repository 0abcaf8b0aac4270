"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from rest_framework.exceptions import APIException

from deployments.adoption import SHUTDOWN_REASON
from deployments.api.tokens import HashedTokenAuthentication
from deployments.models import Deployment, Mode, State


def health(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. It touches nothing else, so it never flaps."""
    return JsonResponse({"status": "ok"})


def counted(deployment: Deployment) -> bool:
    """Whether readiness waits for it: an always-on deployment, unless an operator stopped
    it (a stop on purpose; one stopped by Modelship's own shutdown starts again, so it
    counts until it does)."""
    if deployment.effective_mode != Mode.ALWAYS_ON:
        return False
    return deployment.state != State.STOPPED or deployment.state_reason == SHUTDOWN_REASON


def staff_caller(request: HttpRequest) -> bool:
    """A signed-in staff user, or one whose /api token the request carries."""
    user: Any = request.user
    if not user.is_authenticated:
        try:
            found = HashedTokenAuthentication().authenticate(request)
        except APIException:
            found = None  # a wrong token learns what anyone does
        user = found[0] if found else user
    return bool(user.is_authenticated and user.is_staff)


def readyz(request: HttpRequest) -> JsonResponse:
    """503 until every always-on deployment that should run is ready. Anyone learns whether
    it is ready; only staff (signed in, or with an /api token) also see each deployment's
    state and reason (names and failure texts are the operator's business)."""
    # What the effective mode reads (an unset mode that scales to zero is on demand).
    rows = Deployment.objects.only(
        "name", "state", "state_reason", "mode", "system", "autoscaling_config"
    )
    pinned = [d for d in rows if counted(d)]
    ready = all(d.state == State.READY for d in pinned)
    body: dict[str, object] = {"status": "ready" if ready else "not_ready"}
    if staff_caller(request):
        body["deployments"] = {d.name: {"state": d.state, "reason": d.state_reason} for d in pinned}
    return JsonResponse(body, status=200 if ready else 503)
