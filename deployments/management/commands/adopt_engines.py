from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from deployments.adoption import adopt_all


class Command(BaseCommand):
    help = "Adopt running engines after a restart; mark deployments whose engine is gone stopped."

    def handle(self, *args: Any, **options: Any) -> None:
        outcome = adopt_all()
        for label, names in outcome.items():
            self.stdout.write(f"{label}: {', '.join(names) or '-'}")
