"""Benchmark: a burst of first requests to a stopped on-demand model.

N clients (1,000 by default) send a streaming chat at once to a stopped on-demand deployment
of the simulated engine, through the gateway as `make run` serves it
(`modelship_site.server`). What should happen: one start, every request answered once the
engine is up, none refused, and the gateway's counters back at zero afterwards.

Baseline: the same engine's command line spawned by hand, its health polled every 10 ms,
then one request sent to it directly (bench/cold_start.py's `direct`): what a client that
started the engine itself would wait. The burst's waits are compared to it.

    .venv/bin/python bench/cold_burst.py [--clients 1000] [--startup-delay 1.0]

Prints the number of starts, errors, and the first-byte waits (p50, p99, max; each from
when its request went out) against the direct start, and the same burst sent straight to the
engine once it runs (the engine's own share of the waits, on the same two cores); exits 1
when a request failed, the engine started more than once, or a counter stayed above zero.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import httpx

if TYPE_CHECKING:
    from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cold_start import CHAT, direct  # noqa: E402
from gateway import cpu_seconds, settled, wait_up  # noqa: E402
from start_to_ready import setup_django  # noqa: E402

NAME = "burst"


Wait = tuple[float, float]  # seconds to the first event: from the burst's start, from sending


async def one(session: aiohttp.ClientSession, url: str, began: float) -> Wait | str:
    """Seconds to the answer's first event (from the burst's start, and from when this
    request went out), or what went wrong."""
    body = {**CHAT, "model": NAME}
    sent: dict[str, float] = {}
    try:
        async with session.post(url, json=body, trace_request_ctx=sent) as answer:
            if answer.status != 200:
                return f"{answer.status}: {(await answer.text())[:200]}"
            async for line in answer.content:
                if line.startswith(b"data:"):
                    now = time.perf_counter()
                    await answer.read()  # the rest of the stream
                    return now - began, now - sent.get("at", began)
    except aiohttp.ClientError as exc:
        return repr(exc)
    return "empty answer"


async def _headers_sent(_: object, context: SimpleNamespace, __: object) -> None:
    context.trace_request_ctx["at"] = time.perf_counter()


async def burst(url: str, key: str, clients: int) -> list[Wait | str]:
    connector = aiohttp.TCPConnector(limit=0)  # one connection per client, all at once
    timeout = aiohttp.ClientTimeout(total=300)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    # One client process opening 1,000 connections takes a while to send the last request
    # (its own CPU): a wait counts from when its request went out, as a server sees it.
    tracing = aiohttp.TraceConfig()
    tracing.on_request_headers_sent.append(_headers_sent)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers, trace_configs=[tracing]
    ) as s:
        began = time.perf_counter()
        return list(await asyncio.gather(*(one(s, url, began) for _ in range(clients))))


def counters(base: str) -> dict[str, float]:
    """The gateway's in-flight and queued gauges for the deployment (from /metrics)."""
    text = httpx.get(base + "/metrics", timeout=10).text
    found = {}
    for metric in ("modelship_inflight_requests", "modelship_queued_requests"):
        match = re.search(rf'^{metric}{{deployment="{NAME}"}} (\S+)$', text, re.M)
        found[metric] = float(match.group(1)) if match else 0.0
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--startup-delay", type=float, default=1.0, help="the engine's start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "metrics")
        (workdir / "metrics").mkdir()
        setup_django(workdir)
        from deployments import deployer  # noqa: PLC0415 - after setup_django()
        from deployments.loaders import EngineSpec, get_loader  # noqa: PLC0415 - after setup_django()
        from deployments.models import Deployment, DeploymentEvent  # noqa: PLC0415 - after setup_django()
        from deployments.runtimes.process import free_port  # noqa: PLC0415 - after setup_django()
        from openai_api.models import ApiKey  # noqa: PLC0415 - after setup_django()

        deployment = Deployment.objects.create(
            name=NAME,
            model="simulated",
            loader="simulated",
            memory_gib=1,
            mode="on_demand",
            idle_timeout_s=600,
            config={"startup_delay_s": args.startup_delay, "tokens_per_second": 1000},
        )
        loader = get_loader(deployment.loader)
        argv = loader.argv(EngineSpec.of(deployment), "{host}", "{port}")
        alone = direct(argv, NAME, loader.env(EngineSpec.of(deployment)))
        _, key = ApiKey.issue("bench", requests_per_minute=10**9)
        port = free_port("127.0.0.1")
        env = {**os.environ, "MSHIP_IN_CONTAINER": "0", "MSHIP_ACCESS_LOG": "off"}
        env["MSHIP_ONDEMAND_KEY_FILE"] = str(workdir / "ondemand_key")
        env["MSHIP_MAX_CONNECTIONS_PER_CLIENT"] = "0"  # the burst is from one address
        (workdir / "ondemand_key").write_text(secrets.token_hex(16))
        server = subprocess.Popen(
            [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
            cwd=REPO,
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_up(base + "/health", proc=server)
            # A server that has answered before (its route table loaded): what is measured
            # is the burst, not the process's first request.
            httpx.get(base + "/v1/models", headers={"authorization": f"Bearer {key}"})
            gateway_before, client_before = cpu_seconds(server.pid), time.process_time()
            began, began_at = time.monotonic(), time.time()
            results = asyncio.run(burst(base + "/v1/chat/completions", key, args.clients))
            wall = time.monotonic() - began
            running = Deployment.objects.get(pk=deployment.pk)
            assert running.state_changed_at is not None  # it started: its state changed
            ready_after = running.state_changed_at.timestamp() - began_at
            engine_pid = int(running.runtime_handle["replicas"][0]["pid"])
            # Where the burst's time went: the CPU each process used over it (the engine's
            # includes its own start), against the wall time on this machine's cores.
            cpu = {
                "gateway": cpu_seconds(server.pid) - gateway_before,
                "engine (with its start)": cpu_seconds(engine_pid),
                "client": time.process_time() - client_before,
            }
            # The gauges of the last streams' ends: a moment after their answers.
            settled(lambda: sum(counters(base).values()))
            left = counters(base)
            # The same burst straight to the engine now running (with its own secret): its
            # own share of the waits.
            engine, secret = running.engine_url, running.runtime_handle["replicas"][0]["secret"]
            at_engine = asyncio.run(burst(engine + "/v1/chat/completions", secret, args.clients))
        finally:
            deployer.stop(deployment.pk)  # the engine the gateway started ends with the run
            server.terminate()
            server.wait()
        starts = DeploymentEvent.objects.filter(deployment_name=NAME, kind="starting").count()
    waits = [r[1] for r in results if isinstance(r, tuple)]
    from_start = [r[0] for r in results if isinstance(r, tuple)]
    errors = [r for r in results if isinstance(r, str)]
    engine_p99 = percentile([r[1] for r in at_engine if isinstance(r, tuple)], 0.99)
    for error in sorted(set(errors))[:5]:
        print("error:", error, file=sys.stderr)
    print("| clients | starts | errors | direct start, first byte (s) | the burst at the running"
          " engine, p99 (s) | p50 (s) | p99 (s) | max (s) | p99 - direct start (s) | p99 from"
          " the burst's start (s) | in flight / queued after |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    nan = float("nan")
    p99 = percentile(waits, 0.99) if waits else nan
    print(
        f"| {args.clients} | {starts} | {len(errors)} | {alone:.3f} | {engine_p99:.3f} | "
        f"{statistics.median(waits) if waits else nan:.3f} | {p99:.3f} | "
        f"{max(waits, default=nan):.3f} | {p99 - alone:+.3f} | "
        f"{percentile(from_start, 0.99) if from_start else nan:.3f} | "
        f"{left['modelship_inflight_requests']:.0f} / {left['modelship_queued_requests']:.0f} |"
    )
    spent = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in cpu.items())
    print(
        f"\nThe engine was ready {ready_after:.2f} s into the burst. CPU over the burst: {spent};"
        f" wall {wall:.2f} s on {os.cpu_count()} cores. Waits count from each request's send;"
        " the client sent its last request"
        f" {max(a - w for a, w in (r for r in results if isinstance(r, tuple))):.2f} s into"
        " the burst."
    )
    if errors or starts != 1 or any(left.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
