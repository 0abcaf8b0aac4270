"""What the on-demand side keeps in the database: the last LiteLLM sync's outcome, for the
API (the sync runs in the django-q cluster, the API in the web server)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import models
from django.utils import timezone

log = logging.getLogger("ondemand.litellm")


class LiteLLMStatus(models.Model):
    """One row: the last sync."""

    ok = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")
    synced_at = models.DateTimeField(null=True)
    added = models.PositiveIntegerField(default=0)
    deleted = models.PositiveIntegerField(default=0)
    deployments = models.JSONField(default=dict)  # deployment id -> status word

    class Meta:
        verbose_name = "LiteLLM status"

    def __str__(self) -> str:
        return f"LiteLLM sync: {'ok' if self.ok else self.error or 'never'} at {self.synced_at}"

    @classmethod
    def record(cls, outcome: Any, statuses: dict[int, str]) -> None:
        previous = cls.objects.filter(pk=1).first()
        if outcome.error and (previous is None or previous.ok):
            # Logged once per outage, not once a minute.
            log.warning("LiteLLM sync failed: %s", outcome.error)
        cls.objects.update_or_create(
            pk=1,
            defaults={
                "ok": not outcome.error,
                "error": outcome.error,
                "synced_at": timezone.now(),
                "added": len(outcome.added),
                "deleted": len(outcome.deleted),
                "deployments": {str(k): v for k, v in statuses.items()},
            },
        )
