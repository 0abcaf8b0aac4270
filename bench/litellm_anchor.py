"""Benchmark: the anchor. A real LiteLLM proxy (the dev extra's `litellm[proxy]`) in front of
the same engine as Modelship's gateway, the same non-streaming load against each.

LiteLLM runs the static model_list that `manage.py litellm_config` renders for the site (an
always-on deployment goes straight to its engine), with a master key and nothing else; the
gateway is `modelship_site.server`, as `make run` serves it. Both are called alternately at
the same concurrency (32 by default) for the same time; the engine is the simulated one with
no token pacing. Prints requests per second and latency for each, and Modelship's req/s over
LiteLLM's (the goal: at least 20x).

    .venv/bin/python bench/litellm_anchor.py [--seconds 10] [--concurrency 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import free_port, load, process, simulated_site  # noqa: E402

# LiteLLM reads these as its own (a database layer, a Redis cache, its metrics folder).
NOT_FOR_LITELLM = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")


def litellm_config(env: dict[str, str], master: str) -> dict[str, Any]:
    rendered = subprocess.run(
        [sys.executable, "manage.py", "litellm_config"],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    config: dict[str, Any] = yaml.safe_load(rendered)
    config["general_settings"] = {"master_key": master}
    config.setdefault("litellm_settings", {})["set_verbose"] = False
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"litellm": [], "modelship": []}
    with simulated_site(0) as (workdir, env, key):
        master = "sk-bench-" + secrets.token_hex(8)
        (workdir / "litellm.yaml").write_text(yaml.safe_dump(litellm_config(env, master)))
        litellm_port, gateway_port = free_port(), free_port()
        litellm_env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_LITELLM}
        litellm_env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        litellm_env["LITELLM_LOG"] = "ERROR"
        litellm = Path(sys.executable).parent / "litellm"
        targets = {
            "litellm": (f"http://127.0.0.1:{litellm_port}", {"authorization": f"Bearer {master}"}),
            "modelship": (f"http://127.0.0.1:{gateway_port}", {"authorization": f"Bearer {key}"}),
        }
        with (
            process(
                [
                    str(litellm),
                    "--config",
                    str(workdir / "litellm.yaml"),
                    "--port",
                    str(litellm_port),
                ],
                litellm_env,
                targets["litellm"][0] + "/health/liveliness",
                timeout=180,
            ) as litellm_pid,
            process(
                [sys.executable, "-m", "modelship_site.server", "--port", str(gateway_port)],
                env,
                targets["modelship"][0] + "/health",
            ) as gateway_pid,
        ):
            pids = {"litellm": litellm_pid, "modelship": gateway_pid}
            for base, headers in targets.values():  # warm up
                asyncio.run(load(base + "/v1/chat/completions", headers, 4, 2.0))
            for _ in range(args.rounds):
                for name, (base, headers) in targets.items():
                    url = base + "/v1/chat/completions"
                    results[name].append(
                        asyncio.run(load(url, headers, args.concurrency, args.seconds, pids[name]))
                    )
    report(results, args.concurrency)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def report(results: dict[str, list[dict[str, float]]], concurrency: int) -> None:
    def median(name: str, figure: str) -> float:
        return statistics.median(r[figure] for r in results[name])

    print(f"| proxy | c={concurrency} req/s | p50 ms | p99 ms | CPU µs/req |")
    print("| --- | --- | --- | --- | --- |")
    for name in results:
        print(
            f"| {name} | {median(name, 'rps'):.0f} | {median(name, 'p50_ms'):.1f} |"
            f" {median(name, 'p99_ms'):.1f} | {median(name, 'cpu_us'):.0f} |"
        )
    ratio = median("modelship", "rps") / median("litellm", "rps")
    print(f"\nModelship over LiteLLM, req/s at c={concurrency}: {ratio:.1f}x")


if __name__ == "__main__":
    main()
