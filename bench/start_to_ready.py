"""Benchmark: create-to-ready of an engine through the deployer against launching it by hand.

Baseline: spawn the simulated engine's command line and poll its health, as a script would.
Modelship: deployer.restart() (fit check, start-up gate, process runtime, health wait, state
transitions and events in the database), then deployer.stop(). Both in this process tree,
alternating, so the ratio is what Modelship's control plane adds to a start.

    .venv/bin/python bench/start_to_ready.py [--runs 10] [--docker IMAGE]

With --docker, the same simulated engine also runs as a container of IMAGE (the tests'
engine image: `docker images modelship-test-engine`), started by the docker runtime, and the
baseline is `docker run` of the same command through the docker SDK.
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
from typing import TYPE_CHECKING, Any

import docker
import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import site_db  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable


def setup_django(workdir: Path) -> None:
    database = workdir / "bench.sqlite3"
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{database}")
    os.environ["MSHIP_VAR_DIR"] = str(workdir)
    # The engine environments stay the repository's (installed once, minutes each).
    os.environ.setdefault("MSHIP_ENGINE_ENVS_DIR", str(REPO / "var" / "engines"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "modelship_site.settings"
    import django  # noqa: PLC0415 - once the environment above is set
    from django.core.management import call_command  # noqa: PLC0415 - once the environment above is set

    # run_all's migrated template, where the site is this folder's SQLite (not a caller's
    # DATABASE_URL); in place before Django could open it
    copied = os.environ["DATABASE_URL"] == f"sqlite:///{database}" and site_db.copy_to(database)
    django.setup()
    if not copied:
        call_command("migrate", verbosity=0)


def wait_healthy(url: str) -> None:
    """Poll every 10 ms: the baseline is the engine's own start, as closely as a client
    sees it (the deployer polls every 20 ms in a start's first seconds)."""
    with httpx.Client(timeout=2) as client:
        while True:
            try:
                if client.get(url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.01)


def direct_start(argv: list[str]) -> float:
    from deployments.runtimes.process import free_port  # noqa: PLC0415 - after setup_django()

    port = free_port("127.0.0.1")
    argv = [a.replace("{host}", "127.0.0.1").replace("{port}", str(port)) for a in argv]
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(f"http://127.0.0.1:{port}")
    elapsed = time.perf_counter() - began
    proc.terminate()
    proc.wait()
    return elapsed


def docker_direct_start(image: str, argv: list[str], volumes: list[str]) -> float:
    client = docker.from_env()
    argv = [a.replace("{host}", "0.0.0.0").replace("{port}", "8000") for a in argv]
    began = time.perf_counter()
    box = client.containers.run(
        image,
        argv,
        detach=True,
        init=True,
        ports={"8000/tcp": ("127.0.0.1", None)},
        volumes=volumes,
        working_dir=str(REPO),
    )
    box.reload()
    port = box.attrs["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"]
    wait_healthy(f"http://127.0.0.1:{port}")
    elapsed = time.perf_counter() - began
    box.remove(force=True)
    return elapsed


def modelship_start(pk: int) -> float:
    from deployments import deployer  # noqa: PLC0415 - after setup_django()

    began = time.perf_counter()
    deployment = deployer.restart(pk)
    elapsed = time.perf_counter() - began
    assert deployment.state == "ready", deployment.state_reason
    deployer.stop(pk)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--docker", metavar="IMAGE", help="also measure the docker runtime")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup_django(Path(tmp))
        from deployments.loaders import EngineSpec, get_loader  # noqa: PLC0415 - after setup_django()
        from deployments.models import Deployment  # noqa: PLC0415 - after setup_django()

        deployment = Deployment.objects.create(
            name="bench", model="simulated", loader="simulated", memory_gib=1
        )
        argv = get_loader("simulated").argv(EngineSpec.of(deployment), "{host}", "{port}")
        # (runtime, baseline, the baseline's start and its arguments, the deployment)
        rows: list[tuple[str, str, Callable[..., float], tuple[Any, ...], Deployment]] = [
            ("process", "direct launch + health poll", direct_start, (argv,), deployment)
        ]
        if args.docker:
            from django.conf import settings  # noqa: PLC0415 - after setup_django()

            volumes = [
                f"{p}:{p}:ro" for p in sorted({"/usr", sys.base_prefix, sys.prefix, str(REPO)})
            ]
            settings.MSHIP_CONTAINER_PYTHON = sys.executable
            settings.MSHIP_ENGINE_IMAGE = args.docker
            settings.MSHIP_SITE = "bench"
            boxed = Deployment.objects.create(
                name="bench-docker",
                model="simulated",
                loader="simulated",
                memory_gib=1,
                runtime="docker",
                docker_options={"volumes": volumes, "working_dir": str(REPO)},
            )
            container_argv = get_loader("simulated").argv(
                EngineSpec.of(boxed), "{host}", "{port}", container=True
            )
            rows.append(
                (
                    "docker",
                    "docker run + health poll",
                    docker_direct_start,
                    (args.docker, container_argv, volumes),
                    boxed,
                )
            )
        print(f"runs: {args.runs} each, medians")
        print("| runtime | baseline | baseline (s) | Modelship (s) | ratio |")
        print("| --- | --- | --- | --- | --- |")
        for runtime, label, baseline, baseline_args, row in rows:
            direct, managed = [], []
            for _ in range(args.runs):
                direct.append(baseline(*baseline_args))
                managed.append(modelship_start(row.pk))
            d, m = statistics.median(direct), statistics.median(managed)
            print(f"| {runtime} | {label} | {d:.3f} | {m:.3f} | {m / d:.2f} |")


if __name__ == "__main__":
    main()
