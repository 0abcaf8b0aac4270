"""manage.py sync_litellm: register the deployments with the site's LiteLLM proxy now, and
say what changed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ondemand.litellm import sync


class Command(BaseCommand):
    help = "Sync the deployments' entries with the LiteLLM proxy (MSHIP_LITELLM_URL)."

    def handle(self, *args: Any, **options: Any) -> None:
        outcome = sync()
        if outcome is None:
            raise CommandError("No LiteLLM proxy is configured (MSHIP_LITELLM_URL).")
        for entry in outcome.added:
            self.stdout.write(f"added {entry}")
        for entry in outcome.deleted:
            self.stdout.write(f"deleted {entry}")
        if outcome.error:
            raise CommandError(outcome.error)
        if not outcome.added and not outcome.deleted:
            self.stdout.write("unchanged")
