"""Register Modelship's django-q schedules, idempotently (make run calls it)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django_q.models import Schedule

# name -> (task, minutes between runs). django-q's scheduler looks every 30 s, so a minute
# is the finest interval it keeps reliably.
SCHEDULES: dict[str, tuple[str, int]] = {
    "modelship-watchdog": ("deployments.watchdog.check_once", 1),
    "modelship-ondemand-reaper": ("ondemand.tasks.reap", 1),
    "modelship-responses-sweep": ("openai_api.tasks.sweep_responses", 60),
    "modelship-litellm-sync": ("ondemand.tasks.sync_litellm", 1),
    "modelship-usage-sweep": ("openai_api.tasks.sweep_usage", 60),
    "modelship-store-sweep": ("deployments.store.pulls.sweep", 1),
}


def setup_schedules() -> list[str]:
    changed = []
    for name, (func, minutes) in SCHEDULES.items():
        _, created = Schedule.objects.update_or_create(
            name=name,
            defaults={
                "func": func,
                "schedule_type": Schedule.MINUTES,
                "minutes": minutes,
                "repeats": -1,
            },
        )
        if created:
            changed.append(name)
    return changed


class Command(BaseCommand):
    help = "Register the watchdog, the on-demand reaper and the sweeps; idempotent."

    def handle(self, *args: Any, **options: Any) -> None:
        created = setup_schedules()
        self.stdout.write(f"schedules: {', '.join(SCHEDULES)} ({len(created)} new)")
