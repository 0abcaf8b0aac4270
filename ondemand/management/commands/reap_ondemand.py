from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ondemand.reaper import reap_once


class Command(BaseCommand):
    help = (
        "Put every idle on-demand deployment to sleep (where its engine sleeps) or stop it,"
        " once (the django-q schedule does it for you)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        stopped = reap_once()
        self.stdout.write(f"stopped: {', '.join(stopped) or '-'}")
