"""Benchmark: what a decision costs a request when the site's scheduler is another process
(`serve --workers N`, ondemand/scheduler/) against the same decision in the gateway's own
process (a lone worker): a max_concurrency place, an on-demand slot of a ready model, and a
pick between two replicas, each taken and given back, one at a time (c=1, the latency a
request adds), then --concurrency at once (the owner's throughput).

A fresh SQLite database is migrated in a temporary folder, a ready on-demand deployment is
made in it, and `manage.py scheduler` runs beside this process on a Unix socket, as `serve`
runs it; both ways run in this process, taking turns for --rounds rounds. A request with
nothing to decide (an always-on model, one replica, no limit) makes no hop at all: it is not
measured here (bench/gateway.py measures that path).

    .venv/bin/python bench/scheduler_hop.py [--requests 2000] [--rounds 3] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import site_db  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractAsyncContextManager

    from openai_api.catalog import Route

    Take = Callable[[], AbstractAsyncContextManager[Any]]


LOCAL, REMOTE = "in the gateway's process", "the scheduler's process"


def decisions(
    routes: dict[str, Route],
) -> dict[str, Callable[[], AbstractAsyncContextManager[Any]]]:
    from openai_api.dispatch import dispatcher  # noqa: PLC0415 - after django.setup()

    capped, ready, pair = routes["capped"], routes["ready"], routes["pair"]
    return {
        "max_concurrency place": lambda: dispatcher.limited_slot(capped, None, None),
        "on-demand slot (ready)": lambda: dispatcher.on_demand_slot(ready),
        "replica of two": lambda: dispatcher.replica(pair.urls, pair.name),
    }


async def timed(take: Take, count: int) -> list[float]:
    took = []
    for _ in range(count):
        began = time.perf_counter()
        async with take():
            pass
        took.append(time.perf_counter() - began)
    return took


async def throughput(take: Take, count: int, concurrency: int) -> float:
    async def worker(share: int) -> None:
        for _ in range(share):
            async with take():
                pass

    began = time.perf_counter()
    await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))
    return (count // concurrency * concurrency) / (time.perf_counter() - began)


async def measure(url: str, count: int, concurrency: int) -> dict[str, dict[str, float]]:
    from django.conf import settings  # noqa: PLC0415

    from openai_api.catalog import catalog  # noqa: PLC0415

    settings.MSHIP_SCHEDULER_URL = url
    snapshot = await catalog.current()
    figures = {}
    for name, take in decisions(snapshot.routes).items():
        await timed(take, 50)  # the link made, the lease written: as in a running gateway
        took = sorted(await timed(take, count))
        figures[name] = {
            "p50_us": statistics.median(took) * 1e6,
            "p99_us": took[int(len(took) * 0.99) - 1] * 1e6,
            "per_s": await throughput(take, count, concurrency),
        }
    return figures


def run(count: int, rounds: int, concurrency: int, tmp: str) -> int:
    import django  # noqa: PLC0415

    copied = site_db.copy_to(Path(tmp, "bench.sqlite3"))  # run_all's migrated template
    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    from deployments.models import Deployment, Mode, State  # noqa: PLC0415

    if not copied:
        call_command("migrate", verbosity=0)
    common = {"model": "simulated", "loader": "simulated", "runtime": "process"}
    one = ["http://127.0.0.1:9"]
    Deployment.objects.create(
        name="ready", mode=Mode.ON_DEMAND, state=State.READY, engine_urls=one, **common
    )
    Deployment.objects.create(
        name="capped", state=State.READY, engine_urls=one, max_concurrency=10_000, **common
    )
    Deployment.objects.create(
        name="pair",
        state=State.READY,
        engine_urls=["http://127.0.0.1:9", "http://127.0.0.2:9"],
        **common,
    )
    socket = f"unix:{tmp}/scheduler.sock"
    owner = subprocess.Popen(
        [sys.executable, "manage.py", "scheduler", "--fresh"],
        cwd=REPO,
        env={**os.environ, "MSHIP_SCHEDULER_URL": socket},
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(tmp, "scheduler.sock").exists():
            if time.monotonic() > deadline or owner.poll() is not None:
                print("the scheduler did not start")
                return 1
            time.sleep(0.05)
        ways = {LOCAL: "", REMOTE: socket}
        results: dict[str, list[dict[str, dict[str, float]]]] = {way: [] for way in ways}

        async def rounds_of() -> None:
            for _ in range(rounds):
                for way, url in ways.items():
                    results[way].append(await measure(url, count, concurrency))

        asyncio.run(rounds_of())
    finally:
        owner.terminate()
        owner.wait(30)
    print(f"{count} decisions x {rounds} rounds, c=1 latency and c={concurrency} rate (medians)")
    print(f"{'decision':26} {'where':26} {'p50 µs':>8} {'p99 µs':>8} {'per s':>9}")
    added = []
    for name in results[LOCAL][0]:
        row = {}
        for way in ways:
            row[way] = {
                k: statistics.median(r[name][k] for r in results[way])
                for k in ("p50_us", "p99_us", "per_s")
            }
            f = row[way]
            print(f"{name:26} {way:26} {f['p50_us']:8.0f} {f['p99_us']:8.0f} {f['per_s']:9.0f}")
        added.append(f"{name}: +{row[REMOTE]['p50_us'] - row[LOCAL]['p50_us']:.0f} µs")
    print("added p50 by the hop: " + "; ".join(added))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ms-hop-", dir="/tmp") as tmp:
        os.environ.update(
            DATABASE_URL=f"sqlite:///{tmp}/bench.sqlite3",
            MSHIP_VAR_DIR=tmp,
            MSHIP_RUN_DIR=tmp,
            DJANGO_SETTINGS_MODULE="modelship_site.settings",
            MSHIP_SECRET_KEY="bench-" + os.urandom(8).hex(),
        )
        sys.exit(run(args.requests, args.rounds, args.concurrency, tmp))


if __name__ == "__main__":
    main()
