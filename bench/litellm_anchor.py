"""Benchmark: the anchor. A real LiteLLM proxy (the dev extra's `litellm[proxy]`) in front of
the same engine as Modelship's gateway, the same non-streaming load against each.

LiteLLM runs the static model_list that `manage.py litellm_config` renders for the site (an
always-on deployment goes straight to its engine), with a master key and nothing else; the
gateway is `modelship_site.server`, as `make run` serves it. Both are called alternately at
the same concurrency (32 by default) for the same time; the engine is the simulated one with
no token pacing. Prints requests per second and latency for each, and Modelship's req/s over
LiteLLM's (the goal: at least 20x).

    .venv/bin/python bench/litellm_anchor.py [--seconds 10] [--concurrency 32] [--rounds 2]
        [--warm-up 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import free_port, load, process, simulated_site  # noqa: E402

# LiteLLM reads these as its own (a database layer, a Redis cache, its metrics folder).
NOT_FOR_LITELLM = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")


def render(into: Path) -> str:
    """`manage.py litellm_config`, written to `into`: Python for the process that makes the
    site (simulated_site's `then`), not a Django start-up of its own."""
    return (
        "from django.core.management import call_command\n"
        f"with open({str(into)!r}, 'w') as out: call_command('litellm_config', stdout=out)\n"
    )


def litellm_config(rendered: Path, master: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(rendered.read_text())
    config["general_settings"] = {"master_key": master}
    config.setdefault("litellm_settings", {})["set_verbose"] = False
    return config


def answering(url: str, headers: dict[str, str], timeout: float = 60) -> None:
    """Until a chat through `url` succeeds: a proxy's health can answer before its first
    chat does, and a measurement (no warm-up in a smoke run) must not begin with refusals."""
    deadline = time.monotonic() + timeout
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    said = "nothing"
    while time.monotonic() < deadline:
        try:
            answer = httpx.post(url, json=body, headers=headers, timeout=30)
            if answer.is_success:
                return
            said = f"{answer.status_code}: {answer.text[:300]}"
        except httpx.HTTPError as exc:
            said = repr(exc)
        time.sleep(0.1)
    raise SystemExit(f"{url} answered no chat in {timeout:.0f} s (last: {said})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--warm-up", type=float, default=2.0, help="seconds of load at c=4 on each (0: none)"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"litellm": [], "modelship": []}
    with (
        tempfile.TemporaryDirectory() as own,
        simulated_site(0, render(Path(own) / "rendered.yaml")) as (workdir, env, key),
        ExitStack() as up,
    ):
        master = "sk-bench-" + secrets.token_hex(8)
        config = litellm_config(Path(own) / "rendered.yaml", master)
        (workdir / "litellm.yaml").write_text(yaml.safe_dump(config))
        litellm_port, gateway_port = free_port(), free_port()
        litellm_env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_LITELLM}
        litellm_env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        litellm_env["LITELLM_LOG"] = "ERROR"
        litellm = Path(sys.executable).parent / "litellm"
        targets = {
            "litellm": (f"http://127.0.0.1:{litellm_port}", {"authorization": f"Bearer {master}"}),
            "modelship": (f"http://127.0.0.1:{gateway_port}", {"authorization": f"Bearer {key}"}),
        }
        # Both start side by side: LiteLLM's imports alone take seconds.
        with ThreadPoolExecutor(2) as pool:
            proxy = pool.submit(
                up.enter_context,
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
                ),
            )
            gateway = pool.submit(
                up.enter_context,
                process(
                    [sys.executable, "-m", "modelship_site.server", "--port", str(gateway_port)],
                    env,
                    targets["modelship"][0] + "/health",
                ),
            )
        pids = {"litellm": proxy.result(), "modelship": gateway.result()}
        for base, headers in targets.values():
            answering(base + "/v1/chat/completions", headers)
        if args.warm_up:
            for base, headers in targets.values():
                asyncio.run(load(base + "/v1/chat/completions", headers, 4, args.warm_up))
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
