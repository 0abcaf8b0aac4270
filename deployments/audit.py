"""Audit rows and deployment events: who did what to which deployment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.redact import redact, redact_urls
from common.request_id import current_request_id
from deployments.models import AuditEntry, Deployment, DeploymentEvent

if TYPE_CHECKING:
    from datetime import datetime


def actor_of(user: Any | None, actor: str | None) -> str:
    if actor:
        return actor
    if user is not None and getattr(user, "is_authenticated", False):
        return str(user.get_username())
    return "system"


def record(
    action: str,
    deployment: Deployment | None,
    *,
    user: Any | None = None,
    actor: str | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    text: str = "",
    object_repr: str | None = None,
) -> AuditEntry:
    authenticated = user if user is not None and getattr(user, "is_authenticated", False) else None
    return AuditEntry.objects.create(
        user=authenticated,
        actor=actor_of(user, actor),
        request_id=current_request_id.get(),
        action=action,
        deployment=deployment if deployment is not None and deployment.pk else None,
        object_repr=object_repr if object_repr is not None else str(deployment or ""),
        # Environment values, tokens, secret-named options and URLs' credentials
        # (user:password@, ?token=: a pull's source) never reach an audit row.
        before=redact_urls(redact(before)),
        after=redact_urls(redact(after)),
        text=redact_urls(text),
    )


def event(deployment: Deployment, kind: str, text: str = "", actor: str = "system") -> None:
    DeploymentEvent.objects.create(
        deployment=deployment, deployment_name=deployment.name, actor=actor, kind=kind, text=text
    )


def event_at(
    deployment: Deployment, kind: str, at: datetime, text: str = "", actor: str = "system"
) -> None:
    """An event of something that began at `at`, written once it is known to have worked."""
    row = DeploymentEvent.objects.create(
        deployment=deployment, deployment_name=deployment.name, actor=actor, kind=kind, text=text
    )
    DeploymentEvent.objects.filter(pk=row.pk).update(time=at)
