"""django-q tasks of the public gateway."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from openai_api.responses import replay, store
from openai_api.usage.models import UsageMinute


def sweep_responses() -> int:
    """Delete stored responses past MSHIP_RESPONSES_TTL_S and expired replay-log events
    (scheduled hourly)."""
    return store.sweep() + replay.sweep()


def sweep_usage() -> int:
    """Delete usage rows older than MSHIP_USAGE_RETENTION_DAYS (0: kept forever; hourly)."""
    days = settings.MSHIP_USAGE_RETENTION_DAYS
    if days <= 0:
        return 0
    deleted, _ = UsageMinute.objects.filter(
        minute__lt=timezone.now() - timedelta(days=days)
    ).delete()
    return deleted
