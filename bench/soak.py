"""Benchmark: many open streams held through the gateway for minutes, its memory flat.

N clients (1,000 by default) each keep one streaming chat open through the gateway as `make
run` serves it (`modelship_site.server`), to a simulated engine that paces its tokens
slowly (one a second per stream by default), so the streams stay open together; a stream
that ends is opened again at once, so connections, tasks and sessions keep turning over.

Reported: the gateway's resident memory before, once all N streams are open, and at the
end, with its growth over the soak (the goal: at most 300 MB with 1,000 open, growing at
most 5%); its open file descriptors; the events that came through; and, once every client
stopped, what must be back at zero: the requests in flight (from /metrics), and no
"Unclosed" warning from aiohttp in its output. Exits 1 when a stream failed, a counter
stayed above zero, or something was left unclosed.

    .venv/bin/python bench/soak.py [--streams 1000] [--minutes 10] [--tokens-per-second 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import free_port, settled, simulated_site, wait_up  # noqa: E402

MODEL = "bench-stream"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Clients:
    """N clients, each with one stream open at a time, reopened when it ends."""

    def __init__(self, url: str, key: str, streams: int, tokens: int) -> None:
        self.url, self.key, self.streams, self.tokens = url, key, streams, tokens
        self.open = 0
        self.completed = 0
        self.events = 0
        self.errors: list[str] = []
        self.stopping = asyncio.Event()
        self.ramped = asyncio.Event()  # every stream opened once, or one failed

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        headers = {"authorization": f"Bearer {self.key}"}
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=headers
        ) as session:
            await asyncio.gather(*(self.client(session) for _ in range(self.streams)))

    async def client(self, session: aiohttp.ClientSession) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hold on"}],
            "max_tokens": self.tokens,
            "stream": True,
        }
        while not self.stopping.is_set():
            done = False
            try:
                async with session.post(self.url, json=body) as answer:
                    if answer.status != 200:
                        self.fail(f"{answer.status}: {(await answer.text())[:200]}")
                        return
                    self.open += 1
                    if self.open >= self.streams:
                        self.ramped.set()
                    try:
                        async for line in answer.content:
                            if line.startswith(b"data: [DONE]"):
                                done = True
                            elif line.startswith(b"data: {"):
                                self.events += 1
                            if self.stopping.is_set():
                                return  # a hang-up in the middle: the gateway must let go
                    finally:
                        self.open -= 1
            except aiohttp.ClientError as exc:
                self.fail(repr(exc))
                return
            if not done:
                self.fail("a stream ended without [DONE]")
                return
            self.completed += 1

    def fail(self, error: str) -> None:
        self.errors.append(error)
        self.ramped.set()


def inflight(base: str) -> float:
    text = httpx.get(base + "/metrics", timeout=30).text
    match = re.search(rf'^modelship_inflight_requests{{deployment="{MODEL}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


async def soak(args: argparse.Namespace, base: str, key: str, pid: int) -> dict[str, Any]:
    clients = Clients(base + "/v1/chat/completions", key, args.streams, args.tokens_per_stream)
    before = rss_mib(pid)
    running = asyncio.create_task(clients.run())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(clients.ramped.wait(), 120)
    if clients.open < args.streams:
        opened = clients.open
        clients.stopping.set()
        await running
        raise SystemExit(f"{opened} of {args.streams} streams opened: {clients.errors[:3]}")
    all_open = rss_mib(pid)
    samples = [(0.0, all_open)]
    began = time.monotonic()
    end = began + args.minutes * 60
    while time.monotonic() < end:
        await asyncio.sleep(min(args.sample_every, max(0.0, end - time.monotonic())))
        samples.append((time.monotonic() - began, rss_mib(pid)))
    fds_open = open_fds(pid)
    clients.stopping.set()
    await running
    return {
        "streams": args.streams,
        "minutes": args.minutes,
        "rss_before_mib": before,
        "rss_all_open_mib": all_open,
        "rss_end_mib": samples[-1][1],
        "rss_peak_mib": max(s[1] for s in samples),
        "growth": samples[-1][1] / all_open - 1,
        "fds_while_open": fds_open,
        "events": clients.events,
        "streams_completed": clients.completed,
        "errors": clients.errors,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--tokens-per-second", type=float, default=1.0, help="per stream")
    parser.add_argument("--tokens-per-stream", type=int, default=30)
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with simulated_site(args.tokens_per_second) as (workdir, env, key):
        env["MSHIP_MAX_CONNECTIONS"] = str(max(4096, 2 * args.streams))
        env["MSHIP_MAX_CONNECTIONS_PER_CLIENT"] = "0"  # every stream is from this one address
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        output = workdir / "gateway.log"
        with output.open("wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                wait_up(base + "/health", proc=server)
                httpx.get(base + "/v1/models", headers={"authorization": f"Bearer {key}"})
                result = asyncio.run(soak(args, base, key, server.pid))
                # The last hang-ups reach the gateway a moment after the clients let go.
                result["inflight_after"] = settled(lambda: inflight(base))
                result["fds_after"] = open_fds(server.pid)
            finally:
                server.terminate()
                server.wait(30)
        unclosed = [line for line in output.read_text().splitlines() if "Unclosed" in line]
    result["unclosed_warnings"] = len(unclosed)
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if result["errors"] or result["inflight_after"] or unclosed:
        for error in sorted(set(result["errors"]))[:5]:
            print("error:", error, file=sys.stderr)
        raise SystemExit(1)


def report(r: dict[str, Any]) -> None:
    print(
        "| streams | minutes | RSS before (MiB) | all open (MiB) | end (MiB) | peak (MiB) | growth"
        " | fds open | events | streams completed | errors | in flight after | unclosed |"
    )
    print("| --- " * 13 + "|")
    print(
        f"| {r['streams']} | {r['minutes']:g} | {r['rss_before_mib']:.0f} |"
        f" {r['rss_all_open_mib']:.0f} | {r['rss_end_mib']:.0f} | {r['rss_peak_mib']:.0f} |"
        f" {100 * r['growth']:+.1f}% | {r['fds_while_open']} | {r['events']} |"
        f" {r['streams_completed']} | {len(r['errors'])} | {r['inflight_after']:.0f} |"
        f" {r['unclosed_warnings']} |"
    )


if __name__ == "__main__":
    main()
