"""manage.py gpu_check: what Modelship reads from the GPUs, for a check on a GPU host."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments import nvml
from deployments.memory import capacity_gib, gpu_memory_gib, used_gib


class Command(BaseCommand):
    help = "Print the GPUs NVML reports and the memory budget Modelship derives from them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--require-gpu", action="store_true", help="fail without a GPU")

    def handle(self, *args: Any, **options: Any) -> None:
        gpus = nvml.readings()
        if options["require_gpu"] and not gpus:
            raise CommandError("NVML reports no GPU (no driver, or nvidia-ml-py missing)")
        report = {
            "gpus": [g.__dict__ for g in gpus],
            "capacity_gib": round(capacity_gib(), 3),
            "gpu_memory_gib": round(gpu_memory_gib(), 3),
            "used_gib": None if (used := used_gib()) is None else round(used, 3),
        }
        self.stdout.write(json.dumps(report, indent=2))
