"""Liveness and readiness."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from deployments.models import Deployment, Mode, State


def health(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. It touches nothing else, so it never flaps."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """503 until every always-on deployment is ready. Anyone learns whether it is ready;
    only a signed-in staff user also sees each deployment's state and reason (names and
    failure texts are the operator's business)."""
    # What the effective mode reads (an unset mode that scales to zero is on demand).
    rows = Deployment.objects.only(
        "name", "state", "state_reason", "mode", "system", "autoscaling_config"
    )
    pinned = [d for d in rows if d.effective_mode == Mode.ALWAYS_ON]
    ready = all(d.state == State.READY for d in pinned)
    body: dict[str, object] = {"status": "ready" if ready else "not_ready"}
    if request.user.is_authenticated and request.user.is_staff:
        body["deployments"] = {d.name: {"state": d.state, "reason": d.state_reason} for d in pinned}
    return JsonResponse(body, status=200 if ready else 503)
