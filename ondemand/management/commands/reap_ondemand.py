from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ondemand.reaper import reap_once


class Command(BaseCommand):
    help = "Stop every idle on-demand deployment once (the django-q schedule does it for you)."

    def handle(self, *args: Any, **options: Any) -> None:
        stopped = reap_once()
        self.stdout.write(f"stopped: {', '.join(stopped) or '-'}")
