"""Benchmark: what recording usage costs the gateway (README, "Usage and budgets").

One simulated engine (no pacing) and the gateway as `make run` serves it, started again for
each configuration in turn, several rounds, in one run: recording off (MSHIP_USAGE_RECORD=0),
recording on, and recording on for a key with budgets (checked on every request, counted
at its end). Requests per second and the server's CPU per request at concurrency 32; the
figures are each configuration's median over the rounds, and the ratio is against "off".

    .venv/bin/python bench/usage_cost.py [--seconds 5] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.gateway import load, serving, simulated_site  # noqa: E402

CONFIGS = {
    "off": {"MSHIP_USAGE_RECORD": "0"},
    "on": {"MSHIP_USAGE_RECORD": "1"},
    "on, budgets": {"MSHIP_USAGE_RECORD": "1"},
}
BUDGETED = (
    "import django; django.setup()\n"
    "from openai_api.models import ApiKey\n"
    "print(ApiKey.issue('budgeted', requests_per_minute=10**9, tokens_per_day=10**15,"
    " requests_per_day=10**12)[1])\n"
)


def budgeted_key(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", BUDGETED], env=env, cwd=REPO, check=True, capture_output=True
    )
    return done.stdout.decode().strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    with simulated_site(0) as (_, env, key):
        engine = env_engine(env)
        keys = {"off": key, "on": key, "on, budgets": budgeted_key(env)}
        for _ in range(args.rounds):
            for name, extra in CONFIGS.items():
                headers = {"authorization": f"Bearer {keys[name]}"}
                with serving("gateway", "modelship", {**env, **extra}, engine) as (url, pid):
                    target = url + "/v1/chat/completions"
                    asyncio.run(load(target, headers, 4, 1.0))  # warm up
                    measured = asyncio.run(
                        load(target, headers, args.concurrency, args.seconds, pid)
                    )
                runs[name].append(measured)
                print(name, json.dumps(measured), flush=True)
    results = summary(runs)
    report(results, args.concurrency)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def env_engine(env: dict[str, str]) -> str:
    """The engine the site routes `bench` to (simulated_site made it)."""
    script = (
        "import django; django.setup()\n"
        "from deployments.models import Deployment\n"
        "print(Deployment.objects.get(name='bench').engine_urls[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, check=True, capture_output=True
    )
    return done.stdout.decode().strip().splitlines()[-1]


def summary(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    medians = {
        name: {field: statistics.median(run[field] for run in rows) for field in rows[0]}
        for name, rows in runs.items()
    }
    base = medians["off"]
    for row in medians.values():
        row["rps_ratio"] = row["rps"] / base["rps"]
        row["cpu_ratio"] = row["cpu_us"] / base["cpu_us"]
    return medians


def report(results: dict[str, dict[str, Any]], concurrency: int) -> None:
    print()
    print(f"| usage recording | c={concurrency} req/s | vs off | CPU µs/req | vs off | p99 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in results.items():
        print(
            f"| {name} | {row['rps']:,.0f} | {row['rps_ratio']:.3f} | {row['cpu_us']:,.0f} |"
            f" {row['cpu_ratio']:.3f} | {row['p99_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
