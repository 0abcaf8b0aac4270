"""Benchmark: what hostile input costs the gateway that `make run` serves
(modelship_site/server.py), measured against the same gateway left alone.

1. Stall: the longest gap between two chunks of a token stream (an engine pacing 200 tokens
   a second, so chunks are 5 ms apart), alone and while clients post 16 MiB multipart forms
   of 300,000 empty parts to /v1/audio/transcriptions.
2. Memory: the server's RSS growth while a client streams 1 GiB chunked at /v1, without a key
   and with one.

    .venv/bin/python bench/hostile_input.py [--forms 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import REPO, free_port, prepare_site, process, wait_up

STREAM = {
    "model": "bench-stream",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 600,
    "stream": True,
}


def pathological_form() -> tuple[bytes, str]:
    part = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n\r\n'
    body = part * ((16 * 2**20 - 200) // len(part))
    body += b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nbench\r\n--b--\r\n'
    return body, "multipart/form-data; boundary=b"


async def longest_gap(url: str, headers: dict[str, str], forms: int) -> float:
    """The longest wait between two chunks of one stream, in ms, while `forms` clients post
    pathological forms (each until the stream ends)."""
    body, content_type = pathological_form()
    done = asyncio.Event()
    posted = 0

    async def hostile(session: aiohttp.ClientSession) -> None:
        nonlocal posted
        while not done.is_set():
            form_headers = {**headers, "content-type": content_type}
            async with session.post(
                url + "/v1/audio/transcriptions", data=body, headers=form_headers
            ) as answer:
                await answer.read()
                posted += 1

    async with aiohttp.ClientSession() as session:
        attackers = [asyncio.create_task(hostile(session)) for _ in range(forms)]
        await asyncio.sleep(0.5 if forms else 0)
        gaps = []
        async with session.post(url + "/v1/chat/completions", json=STREAM, headers=headers) as s:
            last = time.perf_counter()
            async for _ in s.content.iter_any():
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
        done.set()
        await asyncio.gather(*attackers, return_exceptions=True)
    if forms:
        print(f"  {posted} forms of 16 MiB posted during the stream")
    return 1000 * max(gaps[1:])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def upload_growth(port: int, pid: int, headers: dict[str, str]) -> tuple[float, int]:
    """(RSS growth in MiB, MiB the server took) while 1 GiB is streamed at it."""
    idle = rss_kib(pid)
    peak = [idle]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak.append(rss_kib(pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    chunk = b"x" * 2**20
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            + head.encode()
            + b"\r\n"
        )
        try:
            while sent < 2**30:
                sock.sendall(frame)
                sent += len(chunk)
        except OSError:
            pass
    stop.set()
    sampler.join()
    return (max(peak) - idle) / 1024, sent >> 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forms", type=int, default=4)
    args = parser.parse_args()
    stream_port, port = free_port(), free_port()
    stream_url = f"http://127.0.0.1:{stream_port}"
    engine = [
        sys.executable,
        "-m",
        "deployments.engines.simulated",
        "--model",
        "bench",
        "--served-model-name",
        "bench",
        "bench-stream",
        "--port",
        str(stream_port),
        "--config",
        json.dumps({"tokens_per_second": 200}),
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(engine, dict(os.environ), stream_url + "/health"),
    ):
        env, key = prepare_site(Path(tmp), stream_url, stream_url)
        headers = {"authorization": f"Bearer {key}"}
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_up(url + "/health")
            alone = asyncio.run(longest_gap(url, headers, 0))
            attacked = asyncio.run(longest_gap(url, headers, args.forms))
            print(
                f"longest gap in a 200 tok/s stream: alone {alone:.1f} ms, with"
                f" {args.forms} clients posting pathological forms {attacked:.1f} ms"
            )
            for label, auth in (("without a key", {}), ("with a key", headers)):
                grown, taken = upload_growth(port, server.pid, auth)
                print(
                    f"1 GiB chunked upload {label}: RSS +{grown:.1f} MiB, the server took"
                    f" {taken} MiB before closing"
                )
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
