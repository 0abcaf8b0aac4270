"""The one door for API keys: issued, changed and revoked here, audited, whichever of the
admin, /api/keys/ or `manage.py createapikey` asks. A key's secret is returned once, by
`issue`, and never stored."""

from __future__ import annotations

from typing import Any

from deployments import audit
from openai_api.models import ApiKey, shown_prefix
from openai_api.usage.models import BUDGETS


def snapshot(key: ApiKey) -> dict[str, Any]:
    """What an audit row shows of a key: never its secret or hash."""
    return {
        "name": key.name,
        "prefix": key.prefix,
        "allowed_models": key.allowed_models,
        "requests_per_minute": key.requests_per_minute,
        "priority": key.priority,
        "max_concurrency": key.max_concurrency,
        "revoked": key.revoked,
        "team": key.team.name if key.team is not None else None,
        **{field: getattr(key, field) for field, _, _ in BUDGETS},
    }


def visible(key: ApiKey) -> str:
    return f"{shown_prefix(key.prefix)}-…"


def record(user: Any, key: ApiKey, action: str, before: dict[str, Any] | None) -> None:
    audit.record(
        action,
        None,
        user=user,
        before=before,
        after=snapshot(key),
        object_repr=f"API key {key.name} ({visible(key)})",
    )


def issue(user: Any, name: str, **fields: Any) -> tuple[ApiKey, str]:
    key, secret = ApiKey.issue(name, **fields)
    record(user, key, "api_key_create", None)
    return key, secret


def change(user: Any, key: ApiKey, **fields: Any) -> ApiKey:
    """Rename or restrict a key (its models, its rate); revoking through here is audited as
    a revocation."""
    before = snapshot(ApiKey.objects.get(pk=key.pk))
    for field, value in fields.items():
        setattr(key, field, value)
    key.full_clean()
    key.save()
    action = "api_key_revoke" if key.revoked and not before["revoked"] else "api_key_change"
    record(user, key, action, before)
    return key


def revoke(user: Any, key: ApiKey) -> bool:
    """False when it was revoked already (nothing is written)."""
    if key.revoked:
        return False
    change(user, key, revoked=True)
    return True
