"""Benchmark: the /v1 gateway against the engine called directly and against the yardstick
(a minimal aiohttp pass-through, bench/yardstick.py), under daphne, uvicorn and `modelship`
(the gateway as `make run` serves it, modelship_site/server.py; the yardstick under plain
uvicorn).

Everything runs on this machine in one run: one simulated engine (no token pacing), the
gateway and the yardstick as ASGI servers in their own processes, and the load from this
process. Non-streaming: requests per second and p50/p99 latency at concurrency 1, 32, 256.
Streaming: tokens per second over 8 concurrent streams from an engine paced at 1,000 tokens
per second per stream (a fast real engine: the proxy must not slow it), and time to first
token.

    .venv/bin/python bench/gateway.py [--seconds 5] [--servers daphne,uvicorn,modelship]
        [--warm-up 1] [--stream-tokens 1000]
    .venv/bin/python bench/gateway.py --servers modelship,modelship-w2   # one process vs two
    .venv/bin/python bench/gateway.py --servers modelship,modelship-uvloop   # the two loops

`modelship-wN` is `serve --workers N --gateway-only`: its ratio against `modelship` (one
process) is the several-processes figure; the load generator shares the machine's cores.
A `-uvloop` server runs on uvloop, its yardstick too; the rest on asyncio's own loop, which
`make run` serves on (MSHIP_SERVE_LOOP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import httpx

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import run_site  # noqa: E402
import site_db  # noqa: E402
import wrk  # noqa: E402

# When a gateway process last loaded or checked its route table (each check that finds it
# unchanged moves it too).
ROUTE_TABLE = re.compile(r"^modelship_route_table_loaded_timestamp_seconds (\S+)$", re.MULTILINE)
CHAT = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_up(url: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until `url` answers; `proc`, the server that should: its exit ends the wait at once
    (a port another process took first, an error at start-up), not after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited ({proc.returncode}) before {url} answered")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def settled(read: Callable[[], float], timeout: float = 10.0) -> float:
    """`read()` once it is zero, or what it still is after `timeout` seconds: a gateway's
    gauge comes down a moment after the last answer ends (its hang-ups, its bookkeeping)."""
    deadline = time.monotonic() + timeout
    while (value := read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def route_table_read(base: str, since: float, timeout: float = 30.0) -> None:
    """Until the gateway at `base` has read its route table since `since` (time.time()):
    two loads or checks of it after `since` from /metrics (the second began after the first
    ended, so after `since`), in place of sleeping through its reload period."""
    deadline = time.monotonic() + timeout
    seen: set[float] = set()
    while time.monotonic() < deadline:
        found = ROUTE_TABLE.search(httpx.get(base + "/metrics", timeout=10).text)
        if found and float(found.group(1)) > since:
            seen.add(float(found.group(1)))
            if len(seen) > 1:
                return
        time.sleep(0.02)
    raise SystemExit(f"{base} did not read its route table in {timeout:.0f} s")


@contextmanager
def process(argv: list[str], env: dict[str, str], probe: str, timeout: float = 60) -> Iterator[int]:
    """A server process, up and answering `probe`; yields its pid."""
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_up(probe, timeout, proc)
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def simulated_engine(port: int, tokens_per_second: float) -> list[str]:
    """The simulated engine's command line, serving `bench` and `bench-stream` (0: no
    pacing)."""
    return [
        *(sys.executable, "-m", "deployments.engines.simulated", "--model", "bench"),
        *("--served-model-name", "bench", "bench-stream", "--port", str(port)),
        *("--config", json.dumps({"tokens_per_second": tokens_per_second})),
    ]


@contextmanager
def simulated_site(
    tokens_per_second: float, then: str = ""
) -> Iterator[tuple[Path, dict[str, str], str]]:
    """A simulated engine running and a site in a temporary folder that routes `bench` and
    `bench-stream` to it, access lines off: (its folder, a server's environment, an API key).
    `then`: as prepare_site's."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(simulated_engine(port, tokens_per_second), dict(os.environ), url + "/health"),
    ):
        env, key = prepare_site(Path(tmp), url, url, then)
        env["MSHIP_ACCESS_LOG"] = "off"
        yield Path(tmp), env, key


def stat_cpu(stat: Path) -> float:
    """User and system CPU seconds a /proc `stat` file (a process's, or one thread's) counts."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process and its children used so far, all their threads
    (Linux /proc): `serve --workers N`'s workers are its children."""
    own = stat_cpu(Path(f"/proc/{pid}/stat"))
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(cpu_seconds(int(child)) for child in children)


# Servers of the gateway beside `modelship` (what `make run` serves: uvicorn with Modelship's
# limits, the access log on), each measured against the yardstick under `modelship`'s uvicorn.
VARIANTS = ("modelship-lean", "modelship-run")


def loop_of(server: str) -> tuple[str, str]:
    """(the server's name without `-uvloop`, its event loop): `modelship-uvloop`, the gateway
    (and its yardstick) on uvloop; the rest on the loop `make run` serves on
    (MSHIP_SERVE_LOOP's default)."""
    base = server.removesuffix("-uvloop")
    return base, "asyncio" if base == server else "uvloop"


def server_argv(server: str, app: str, port: int) -> list[str]:
    server, loop = loop_of(server)
    if server == "modelship-run" and app == "modelship_site.asgi:application":
        # `make run`'s own process: `serve`, its django-q cluster and autoscaler beside it.
        return [sys.executable, "manage.py", "serve", "--port", str(port)]
    if server in VARIANTS:
        server = "modelship"  # the lean gateway: the same server, the access log off
    if server.startswith("modelship-w") and app == "modelship_site.asgi:application":
        # `serve --workers N`: N gateway processes on one socket (the engines are not theirs).
        workers = server.removeprefix("modelship-w")
        serve = [sys.executable, "manage.py", "serve", "--port", str(port), "--gateway-only"]
        return [*serve, "--workers", workers]
    if server.startswith("modelship-w"):
        server = "modelship"  # the yardstick: one process, as before
    if server == "modelship" and app == "modelship_site.asgi:application":
        # What `make run` serves: uvicorn with Modelship's connection limits.
        return [sys.executable, "-m", "modelship_site.server", "--port", str(port)]
    if server in ("uvicorn", "modelship"):  # the yardstick under the same uvicorn
        return [
            sys.executable,
            "-m",
            "uvicorn",
            app,
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
            "--loop",
            loop,
        ]
    return [sys.executable, "-m", "daphne", "-p", str(port), app]


def measure(
    driver: str,
    url: str,
    headers: dict[str, str],
    concurrency: int,
    seconds: float,
    pid: int | None = None,
) -> dict[str, float]:
    """Requests per second and latency at a concurrency, from `wrk` or from this process;
    with the server's `pid`, also the CPU the server spent per request (steadier than a rate
    on two shared cores)."""
    if driver == "python":
        return asyncio.run(load(url, headers, concurrency, seconds, pid))
    cpu_before = cpu_seconds(pid) if pid else 0.0
    found = wrk.run(url, CHAT, headers, concurrency, seconds)
    cpu = cpu_seconds(pid) - cpu_before if pid else 0.0
    return {**found, "cpu_us": 1e6 * cpu / found["requests"]}


async def load(
    url: str, headers: dict[str, str], concurrency: int, seconds: float, pid: int | None = None
) -> dict[str, float]:
    """The Python driver: aiohttp from this process (it spends as much CPU as a server)."""
    latencies: list[float] = []
    cpu_before = cpu_seconds(pid) if pid else 0.0
    stop = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while time.monotonic() < stop:
                began = time.perf_counter()
                async with session.post(url, json=CHAT, headers=headers) as answer:
                    said = await answer.read()
                    assert answer.status == 200, (url, answer.status, said[:300])
                latencies.append(time.perf_counter() - began)

        began = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - began
    cpu = cpu_seconds(pid) - cpu_before if pid else 0.0
    latencies.sort()
    return {
        "cpu_us": 1e6 * cpu / len(latencies),
        "requests": float(len(latencies)),
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


async def stream(url: str, headers: dict[str, str], streams: int, tokens: int) -> dict[str, float]:
    body = {**CHAT, "model": "bench-stream", "stream": True, "max_tokens": tokens}
    ttfts: list[float] = []
    counted = 0
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            nonlocal counted
            began = time.perf_counter()
            first = True
            async with session.post(url, json=body, headers=headers) as answer:
                async for line in answer.content:
                    if (
                        line.startswith(b"data: {")
                        and b'"content": "' in line
                        and b'"content": ""' not in line
                    ):
                        if first:
                            ttfts.append(time.perf_counter() - began)
                            first = False
                        counted += 1

        began = time.monotonic()
        await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.monotonic() - began
    return {"tokens_per_s": counted / elapsed, "ttft_ms": 1000 * statistics.median(ttfts)}


def prepare_site(
    workdir: Path, engine_url: str, stream_url: str, then: str = ""
) -> tuple[dict[str, str], str]:
    """A site in `workdir` that routes `bench` to `engine_url` and `bench-stream` to
    `stream_url`, and an API key of it: (a server's environment, the key). Beside its
    database, the same with the key and no deployments yet (run_site.KEYS_ONLY), for a site
    that starts its own engines. `then`: more Python for the process that made the site,
    once it is made (what it prints goes nowhere): a Django start-up, not another."""
    database = workdir / "bench.sqlite3"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{database}",
        "MSHIP_VAR_DIR": str(workdir),
        "DJANGO_SETTINGS_MODULE": "modelship_site.settings",
    }
    migrate = "" if site_db.copy_to(database) else site_db.MIGRATE_HERE
    script = (
        "import sqlite3\n"
        "import django; django.setup()\n"
        f"{migrate}"
        "from django.db import connection\n"
        "from deployments.models import Deployment\n"
        "from openai_api.models import ApiKey\n"
        "key = ApiKey.issue('bench', requests_per_minute=10**9)[1]\n"
        "connection.ensure_connection()\n"
        f"copy = sqlite3.connect({str(workdir / run_site.KEYS_ONLY)!r})\n"
        "connection.connection.backup(copy)\n"
        "copy.close()\n"
        f"Deployment.objects.create(name='bench', model='m', loader='simulated', memory_gib=1,"
        f" state='ready', engine_urls=['{engine_url}'])\n"
        f"Deployment.objects.create(name='bench-stream', model='m', loader='simulated',"
        f" memory_gib=1, state='ready', engine_urls=['{stream_url}'])\n"
        f"{then}"
        "print(key)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return env, done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--servers", default="daphne,uvicorn")
    parser.add_argument("--concurrency", default="1,32,256")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="each load this many times, the targets taking turns; each figure is the median",
    )
    parser.add_argument(
        "--warm-up",
        type=float,
        default=1.0,
        help="seconds of load at c=4 on each target before the first figure (0: none)",
    )
    parser.add_argument("--stream-tokens", type=int, default=1000, help="per stream, 8 at once")
    parser.add_argument("--json", help="also write the results here")
    wrk.driver_option(parser)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    engine_port, stream_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    stream_url = f"http://127.0.0.1:{stream_port}"

    with (
        tempfile.TemporaryDirectory() as tmp,
        process(simulated_engine(engine_port, 0), dict(os.environ), engine_url + "/health"),
        process(simulated_engine(stream_port, 1000), dict(os.environ), stream_url + "/health"),
    ):
        env, key = prepare_site(Path(tmp), engine_url, stream_url)
        targets: list[tuple[str, str, str]] = [("direct", "direct", "")]
        for server in args.servers.split(","):
            base, loop = loop_of(server)
            if base == "daphne" and loop == "uvloop":
                raise SystemExit("daphne runs on Twisted's reactor: no -uvloop for it")
            if base not in VARIANTS:
                targets.append((f"yardstick/{server}", "yardstick", server))
            targets.append((f"gateway/{server}", "gateway", server))
        results: dict[str, Any] = {label: {} for label, _, _ in targets}
        auth = {"authorization": f"Bearer {key}"}
        with ExitStack() as up:
            # Every target up at once, so each round of a load visits all of them in turn
            # (the same minute's machine for each), each in another order per round. They
            # start side by side: a start is mostly waits (imports, engines, health polls).
            with ThreadPoolExecutor(len(targets)) as pool:
                starting = {
                    label: pool.submit(
                        up.enter_context, serving(kind, server, env, engine_url, key)
                    )
                    for label, kind, server in targets
                }
            kinds = {label: kind for label, kind, _ in targets}
            served = {label: (future.result(), kinds[label]) for label, future in starting.items()}
            for (url, _), kind in served.values():
                headers = auth if kind == "gateway" else {}
                chat = url + "/v1/chat/completions"
                if args.warm_up:
                    measure(args.driver, chat, headers, 4, args.warm_up)
            for c in levels:
                runs: dict[str, list[dict[str, float]]] = {label: [] for label in served}
                labels = list(served)
                for round_ in range(args.rounds):
                    turn = round_ % len(labels)
                    for label in labels[turn:] + labels[:turn]:
                        (url, pid), kind = served[label]
                        headers = auth if kind == "gateway" else {}
                        chat = url + "/v1/chat/completions"
                        runs[label].append(
                            measure(args.driver, chat, headers, c, args.seconds, pid)
                        )
                for label, found in runs.items():
                    results[label][c] = medians(found)
                    print(label, c, json.dumps(results[label][c]), flush=True)
            for label, kind, server in targets:
                headers = auth if kind == "gateway" else {}
                with ExitStack() as streaming:
                    url = served[label][0][0]
                    if kind != "gateway":
                        # The yardstick and the engine know one upstream: the streaming
                        # engine gets its own instance (a gateway routes `bench-stream`).
                        url, _ = streaming.enter_context(
                            serving(kind, server, env, stream_url, key)
                        )
                    chat = url + "/v1/chat/completions"
                    if args.warm_up:
                        asyncio.run(stream(chat, headers, 1, 10))
                    results[label]["stream"] = asyncio.run(
                        stream(chat, headers, 8, args.stream_tokens)
                    )
    report(results, levels)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


@contextmanager
def serving(
    kind: str, server: str, env: dict[str, str], upstream: str, key: str = ""
) -> Iterator[tuple[str, int | None]]:
    """The base URL of a target (the engine itself, or an ASGI server in front of it) and
    the server's pid (None for the engine: it is not what is measured). `modelship-run`
    serves its own engines (bench/run_site.py), the site's `key` still valid."""
    if kind == "direct":
        yield upstream, None
        return
    port = free_port()
    base, loop_name = loop_of(server)
    loop = {"MSHIP_SERVE_LOOP": loop_name}
    if kind == "gateway" and base == "modelship-run":
        with run_site.serve({**env, "MSHIP_ACCESS_LOG": "json", **loop}, port, key) as pid:
            yield f"http://127.0.0.1:{port}", pid
        return
    app = "bench.yardstick:app" if kind == "yardstick" else "modelship_site.asgi:application"
    # The access log as `make run` has it (whatever the caller's environment says), but for
    # the lean gateway; its lines go nowhere (process() drops the servers' output).
    log = {"MSHIP_ACCESS_LOG": "off" if base == "modelship-lean" else "json"}
    with process(
        server_argv(server, app, port),
        {**env, "YARDSTICK_UPSTREAM": upstream, **loop, **log},
        f"http://127.0.0.1:{port}/v1/models",
    ) as pid:
        yield f"http://127.0.0.1:{port}", pid


def report(results: dict[str, Any], levels: list[int]) -> None:
    print()
    print(
        "| target | "
        + " | ".join(f"c={c} req/s | p50 ms | p99 ms | CPU µs/req" for c in levels)
        + " | stream tok/s | TTFT ms |"
    )
    print("| --- " * (1 + 4 * len(levels) + 2) + "|")
    for label, row in results.items():
        cells = []
        for c in levels:
            r = row[c]
            cpu = f"{r['cpu_us']:.0f}" if r["cpu_us"] else "-"
            cells += [f"{r['rps']:.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", cpu]
        cells += [f"{row['stream']['tokens_per_s']:.0f}", f"{row['stream']['ttft_ms']:.1f}"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    for label in results:
        if not label.startswith("gateway/"):
            continue
        server = label.split("/")[1]
        base, _ = loop_of(server)
        yardstick = "modelship" + server.removeprefix(base) if base in VARIANTS else server
        yard, gate = results[f"yardstick/{yardstick}"], results[label]
        ratios = ", ".join(
            f"c={c}: {gate[c]['rps'] / yard[c]['rps']:.2f}x req/s, "
            f"p50 {gate[c]['p50_ms'] / yard[c]['p50_ms']:.2f}x, "
            f"CPU/req {gate[c]['cpu_us'] / yard[c]['cpu_us']:.2f}x"
            for c in levels
        )
        direct = results["direct"]["stream"]["tokens_per_s"]
        one = results.get("gateway/modelship")
        if one is not None and server.startswith("modelship-w") and label != "gateway/modelship":
            print(
                f"gateway/{server} against one process (gateway/modelship): "
                + ", ".join(f"c={c}: {gate[c]['rps'] / one[c]['rps']:.2f}x req/s" for c in levels)
            )
        print(
            f"gateway/{server} against yardstick/{yardstick}: {ratios}; streamed tokens "
            f"{gate['stream']['tokens_per_s'] / direct:.2f}x direct, TTFT +"
            f"{gate['stream']['ttft_ms'] - results['direct']['stream']['ttft_ms']:.1f} ms"
        )


if __name__ == "__main__":
    main()
