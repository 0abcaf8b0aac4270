"""Who may do what through /api: Django's model permissions, not just `is_staff`.

Reading needs `view`; creating `add`; editing, and every operation on a running deployment
(start, stop, sleep, wake, mode), `change`; removing `delete`. The host view needs
`view_deployment`. What decides the engine's program needs more (deployments/host_access).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework.permissions import DjangoModelPermissions

from deployments.models import Deployment

if TYPE_CHECKING:
    from rest_framework.request import Request

VIEW = "%(app_label)s.view_%(model_name)s"
CHANGE = "%(app_label)s.change_%(model_name)s"
# Actions on one deployment, by the permission they need (POST on a detail route would
# otherwise read as `add`).
ACTION_PERMS = {
    "start": CHANGE,
    "stop": CHANGE,
    "sleep": CHANGE,
    "wake": CHANGE,
    "mode": CHANGE,
    "logs": VIEW,
    "metrics": VIEW,
}


class ModelPermissions(DjangoModelPermissions):
    perms_map = {
        **DjangoModelPermissions.perms_map,
        "GET": [VIEW],
        "OPTIONS": [VIEW],
        "HEAD": [VIEW],
    }

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated or not request.user.is_staff:
            return False
        action = getattr(view, "action", None)
        if action in ACTION_PERMS:
            return request.user.has_perm(ACTION_PERMS[action] % perms_of(Deployment))
        if getattr(view, "queryset", None) is None and not hasattr(view, "get_queryset"):
            # A plain view (host): it shows deployments.
            return request.user.has_perm(VIEW % perms_of(Deployment))
        return super().has_permission(request, view)


def perms_of(model: Any) -> dict[str, str]:
    return {"app_label": model._meta.app_label, "model_name": model._meta.model_name}


class ApplyPermission(ModelPermissions):
    """A models.yaml adds, changes and (reconciling) removes deployments: all three."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not user or not user.is_authenticated or not user.is_staff:
            return False
        wanted = ("add", "change", "delete")
        return all(user.has_perm(f"deployments.{perm}_deployment") for perm in wanted)
