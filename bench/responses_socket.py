"""Benchmark: the Responses API over its WebSocket against the same API over SSE, from one
gateway process (`modelship_site.server`, as `make run` serves it) in front of one simulated
engine with no token pacing, so the gateway and the transport are what is measured.

- Throughput: 8 concurrent responses of 1,000 tokens each, text deltas per second; SSE is
  one POST per response, the socket one connection per concurrent client.
- Turns: 40 short responses (16 tokens) one after another, each continuing the last by
  `previous_response_id`; over HTTP a POST each (stored, continued from the store), over
  the socket one connection, its responses stored as well ("socket") or not ("socket,
  store: false"), continued from the socket's memory either way: p50 and p99 of a turn,
  first byte sent to terminal event received.

    .venv/bin/python bench/responses_socket.py [--rounds 3] [--tokens 1000] [--turns 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from websockets.asyncio.client import connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.gateway import free_port, prepare_site, process  # noqa: E402

TERMINAL = (b'"response.completed"', b'"response.failed"', b'"response.incomplete"')
DELTA = b'"response.output_text.delta"'


def body(tokens: int, previous: str | None = None, store: bool = True) -> dict[str, Any]:
    return {
        "model": "bench",
        "input": "hi",
        "max_output_tokens": tokens,
        "previous_response_id": previous,
        "store": store,
    }


async def sse_response(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], data: dict[str, Any]
) -> tuple[int, str]:
    """One streamed response over SSE: its text deltas and its id."""
    deltas, rid = 0, ""
    async with session.post(url, json={**data, "stream": True}, headers=headers) as answer:
        assert answer.status == 200, answer.status
        async for line in answer.content:
            if not line.startswith(b"data: "):
                continue
            if DELTA in line:
                deltas += 1
            elif any(kind in line for kind in TERMINAL):
                rid = json.loads(line[6:])["response"]["id"]
    return deltas, rid


async def socket_response(socket: Any, data: dict[str, Any]) -> tuple[int, str]:
    """One response over an open socket: its text deltas and its id."""
    await socket.send(json.dumps({"type": "response.create", **data}))
    deltas = 0
    while True:
        frame = await socket.recv(decode=False)
        if DELTA in frame:
            deltas += 1
        elif any(kind in frame for kind in TERMINAL):
            return deltas, json.loads(frame)["response"]["id"]
        elif b'"type": "error"' in frame:
            raise SystemExit(frame.decode())


async def throughput(base: str, key: str, transport: str, streams: int, tokens: int) -> float:
    headers = {"authorization": f"Bearer {key}"}
    counted = 0

    async def sse_client(session: aiohttp.ClientSession) -> None:
        nonlocal counted
        deltas, _ = await sse_response(session, base + "/v1/responses", headers, body(tokens))
        counted += deltas

    async def socket_client() -> None:
        nonlocal counted
        async with connect(ws_url(base), additional_headers=headers, max_size=None) as socket:
            deltas, _ = await socket_response(socket, body(tokens))
            counted += deltas

    async with aiohttp.ClientSession() as session:
        began = time.perf_counter()
        if transport == "sse":
            await asyncio.gather(*(sse_client(session) for _ in range(streams)))
        else:
            await asyncio.gather(*(socket_client() for _ in range(streams)))
        elapsed = time.perf_counter() - began
    assert counted == streams * tokens, counted
    return counted / elapsed


async def turns(base: str, key: str, transport: str, count: int, store: bool) -> list[float]:
    headers = {"authorization": f"Bearer {key}"}
    took: list[float] = []
    previous: str | None = None
    if transport == "sse":
        async with aiohttp.ClientSession() as session:
            for _ in range(count):
                began = time.perf_counter()
                _, previous = await sse_response(
                    session, base + "/v1/responses", headers, body(16, previous)
                )
                took.append(time.perf_counter() - began)
        return took
    async with connect(ws_url(base), additional_headers=headers) as socket:
        for _ in range(count):
            began = time.perf_counter()
            _, previous = await socket_response(socket, body(16, previous, store))
            took.append(time.perf_counter() - began)
    return took


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/responses"


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1000, help="per response, 8 at once")
    parser.add_argument("--turns", type=int, default=40, help="responses one after another")
    args = parser.parse_args()
    engine_port, gateway_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    base = f"http://127.0.0.1:{gateway_port}"
    engine = [
        *(sys.executable, "-m", "deployments.engines.simulated", "--model", "bench"),
        *("--served-model-name", "bench", "bench-stream", "--port", str(engine_port)),
        *("--config", json.dumps({"tokens_per_second": 0})),
    ]
    rows = ("sse", "socket", "socket, store: false")
    results: dict[str, dict[str, list[float]]] = {
        t: {"tok_s": [], "p50": [], "p99": []} for t in rows
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(engine, dict(os.environ), engine_url + "/health"),
    ):
        env, key = prepare_site(Path(tmp), engine_url, engine_url)
        server = [sys.executable, "-m", "modelship_site.server", "--port", str(gateway_port)]
        with process(server, env, base + "/v1/models"):
            for transport in ("sse", "socket"):  # warm up both
                asyncio.run(throughput(base, key, transport, 2, 50))
                asyncio.run(turns(base, key, transport, 3, True))
            for _ in range(args.rounds):  # alternating, so drift hits all alike
                for label in rows:
                    transport, row = label.split(",")[0], results[label]
                    row["tok_s"].append(
                        asyncio.run(throughput(base, key, transport, 8, args.tokens))
                    )
                    stored = "false" not in label
                    took = asyncio.run(turns(base, key, transport, args.turns, stored))
                    row["p50"].append(p(took, 0.5))
                    row["p99"].append(p(took, 0.99))
    print(f"| transport | text deltas/s (8 x {args.tokens:,} tokens) | turn p50 ms | turn p99 ms |")
    print("| --- | --- | --- | --- |")
    medians = {t: {k: statistics.median(v) for k, v in got.items()} for t, got in results.items()}
    for transport, median in medians.items():
        print(
            f"| {transport} | {median['tok_s']:.0f} | {median['p50']:.1f} | {median['p99']:.1f} |"
        )
    sse = medians["sse"]
    for label in rows[1:]:
        median = medians[label]
        print(
            f"{label} over SSE (median of {args.rounds}): throughput "
            f"{median['tok_s'] / sse['tok_s']:.2f}x, turn p50 {median['p50'] / sse['p50']:.2f}x, "
            f"turn p99 {median['p99'] / sse['p99']:.2f}x"
        )


if __name__ == "__main__":
    main()
