"""manage.py gpu_check: the GPUs Modelship budgets and places on, checked against the driver.

It prints each device (total, held by Modelship's deployments, used as the driver reports,
free) and what a site on this host should set; with --compare-nvidia-smi it checks that NVML,
as Modelship reads it, agrees with nvidia-smi, and with --place-demo it starts two simulated
deployments of num_gpus 0.5 and checks they land on one device and see only it. Any mismatch
exits non-zero (scripts/gpu-check.sh runs it all on a GPU host).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments import deployer, engine_secrets, nvml
from deployments.memory import gpu_inventory, host_summary
from deployments.models import Deployment, State
from deployments.site_hints import hints

DEMO_NAMES = ("gpu-check-a", "gpu-check-b")
SMI_QUERY = "index,uuid,memory.total"


class Command(BaseCommand):
    help = "Show the GPUs Modelship places on; optionally check them against nvidia-smi."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--require-gpu", action="store_true", help="fail without a GPU")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--compare-nvidia-smi",
            action="store_true",
            help="fail unless nvidia-smi reports the same devices, UUIDs and sizes",
        )
        parser.add_argument(
            "--place-demo",
            action="store_true",
            help="start two simulated deployments of num_gpus 0.5, check where they land,"
            " then remove them",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["require_gpu"] and not gpu_inventory():
            raise CommandError(
                "no GPU: NVML reports none (no driver, or nvidia-ml-py missing) and"
                " MSHIP_GPU_INVENTORY declares none"
            )
        problems: list[str] = []
        if options["compare_nvidia_smi"]:
            problems += self.compare_with_nvidia_smi()
        if options["place_demo"]:
            problems += self.place_demo()
        report = host_summary()
        report["settings"] = hints()
        if options["json"]:
            self.stdout.write(json.dumps({**report, "problems": problems}, indent=2))
        else:
            self.stdout.write(table(report))
        if problems:
            raise CommandError("mismatch:\n" + "\n".join(f"  - {p}" for p in problems))

    def compare_with_nvidia_smi(self) -> list[str]:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return ["nvidia-smi is not on PATH"]
        answer = subprocess.run(
            [smi, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        )
        if answer.returncode != 0:
            return [f"nvidia-smi failed: {answer.stderr.strip() or answer.returncode}"]
        theirs: dict[int, tuple[str, float]] = {}
        for line in answer.stdout.strip().splitlines():
            number, uuid, total_mib = (part.strip() for part in line.split(","))
            theirs[int(number)] = (uuid, float(total_mib) / 1024)
        ours = {g.index: (g.uuid, g.total_gib) for g in nvml.readings()}
        problems = []
        if sorted(theirs) != sorted(ours):
            problems.append(f"devices: NVML sees {sorted(ours)}, nvidia-smi {sorted(theirs)}")
        for index in sorted(set(theirs) & set(ours)):
            (their_uuid, their_gib), (our_uuid, our_gib) = theirs[index], ours[index]
            if their_uuid != our_uuid:
                problems.append(f"GPU {index}: UUID {our_uuid} here, {their_uuid} in nvidia-smi")
            if abs(their_gib - our_gib) > 0.01 * their_gib:
                problems.append(f"GPU {index}: {our_gib:.2f} GiB here, {their_gib:.2f} there")
        self.stdout.write(f"nvidia-smi: {len(theirs)} GPU(s), {len(problems)} mismatch(es)")
        return problems

    def place_demo(self) -> list[str]:
        Deployment.objects.filter(name__in=DEMO_NAMES).delete()
        demos = [
            Deployment.objects.create(
                name=name, model="simulated", loader="simulated", num_gpus=0.5
            )
            for name in DEMO_NAMES
        ]
        problems = []
        try:
            for demo in demos:
                deployer.restart(demo.pk)
                demo.refresh_from_db()
                if demo.state != State.READY:
                    problems.append(f"{demo.name}: {demo.state}: {demo.state_reason}")
                    continue
                auth = engine_secrets.auth(demo)
                seen = httpx.get(demo.engine_url + "/sim/env", timeout=10, auth=auth).json()
                given = ",".join(str(i) for i in (demo.gpus or [[]])[0])
                self.stdout.write(
                    f"{demo.name}: placed on GPU {given or 'none'}, the engine sees"
                    f" CUDA_VISIBLE_DEVICES={seen.get('CUDA_VISIBLE_DEVICES')!r}"
                )
                if seen.get("CUDA_VISIBLE_DEVICES") != given:
                    problems.append(f"{demo.name}: placed on {given!r}, sees {seen!r}")
            self.stdout.write(table(host_summary()))
            if len({str(d.gpus) for d in demos}) != 1:
                problems.append("two halves of a GPU were not packed onto one device")
        finally:
            for demo in demos:
                deployer.stop(demo.pk, reason="gpu_check done")
                demo.delete()
        return problems


def table(report: dict[str, Any]) -> str:
    rows = [f"placement: {report['placement']}; capacity {report['capacity_gib']} GiB"]
    if report["gpus"]:
        rows.append(f"{'GPU':>3}  {'name':<24} {'total':>8} {'held':>8} {'used':>8} {'free':>8}")
        for g in report["gpus"]:
            used = "—" if g["used_gib"] is None else f"{g['used_gib']:.2f}"
            rows.append(
                f"{g['index']:>3}  {g['name'][:24]:<24} {g['total_gib']:>8.2f}"
                f" {g['held_gib']:>8.2f} {used:>8} {g['free_gib']:>8.2f}"
                + "".join(f"  {d['name']} {d['holding_gib']}" for d in g["deployments"])
            )
    for hint in report.get("settings", []):
        rows.append(f"set: {hint}")
    return "\n".join(rows) + "\n"
