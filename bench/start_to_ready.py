"""Benchmark: create-to-ready of an engine through the deployer against launching it by hand.

Baseline: spawn the simulated engine's command line and poll its health, as a script would.
Modelship: deployer.restart() (fit check, start-up gate, process runtime, health wait, state
transitions and events in the database), then deployer.stop(). Both in this process tree,
alternating, so the ratio is what Modelship's control plane adds to a start.

    .venv/bin/python bench/start_to_ready.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def setup_django(workdir: Path) -> None:
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    os.environ["MSHIP_VAR_DIR"] = str(workdir)
    os.environ["DJANGO_SETTINGS_MODULE"] = "modelship_site.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def direct_start(argv: list[str]) -> float:
    from deployments.runtimes.process import free_port

    port = free_port("127.0.0.1")
    argv = [a.replace("{host}", "127.0.0.1").replace("{port}", str(port)) for a in argv]
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with httpx.Client(timeout=2) as client:
        while True:
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    elapsed = time.perf_counter() - began
    proc.terminate()
    proc.wait()
    return elapsed


def modelship_start(pk: int) -> float:
    from deployments import deployer

    began = time.perf_counter()
    deployment = deployer.restart(pk)
    elapsed = time.perf_counter() - began
    assert deployment.state == "ready", deployment.state_reason
    deployer.stop(pk)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup_django(Path(tmp))
        from deployments.loaders import EngineSpec, get_loader
        from deployments.models import Deployment

        deployment = Deployment.objects.create(
            name="bench", model="simulated", loader="simulated", memory_gib=1
        )
        argv = get_loader("simulated").argv(EngineSpec.of(deployment), "{host}", "{port}")
        direct, managed = [], []
        for _ in range(args.runs):
            direct.append(direct_start(argv))
            managed.append(modelship_start(deployment.pk))
    d, m = statistics.median(direct), statistics.median(managed)
    print(f"runs: {args.runs} each, medians")
    print("| path | create-to-ready (s) |")
    print("| --- | --- |")
    print(f"| direct launch + health poll | {d:.3f} |")
    print(f"| Modelship deployer (process runtime) | {m:.3f} |")
    print(f"| ratio Modelship / direct | {m / d:.2f} |")


if __name__ == "__main__":
    main()
