"""manage.py scheduler: the site's scheduler owner (ondemand/scheduler/owner.py), in the
foreground. `serve` runs it beside its workers where it runs more than one, or where
MSHIP_SCHEDULER_LISTEN lets --gateway-only hosts in; run by hand, it listens where
MSHIP_SCHEDULER_URL and MSHIP_SCHEDULER_LISTEN say."""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ondemand.scheduler.owner import Owner, addresses


class Command(BaseCommand):
    help = "Run the site's scheduler owner: on-demand slots and max_concurrency places."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="grant at once: no gateway can hold anything yet (serve's first start)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            where = addresses()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not where:
            raise CommandError("set MSHIP_SCHEDULER_URL (unix:/path) or MSHIP_SCHEDULER_LISTEN")
        rebuild_s = 0.0 if options["fresh"] else float(settings.MSHIP_SCHEDULER_REBUILD_S)

        def ready() -> None:
            self.stdout.write(f"scheduler on {', '.join(str(a) for a in where)}")
            self.stdout.flush()

        try:
            asyncio.run(Owner(rebuild_s).run(where, ready))
        except OSError as exc:
            raise CommandError(f"the scheduler cannot listen: {exc}") from exc
