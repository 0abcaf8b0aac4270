"""Profile the gateway under wrk: where its CPU per request goes.

The gateway as `make run` serves it (modelship_site.server, access log on unless --lean) in
front of the unpaced simulated engine, non-streaming chat from wrk at one concurrency, and
py-spy sampling the server process meanwhile. Writes a flame graph (SVG) and prints the
share of the samples each part of the request's way takes (inclusive), and each module's own
share, so what is left to take is named.

    .venv/bin/python bench/flame.py [--seconds 10] [--concurrency 32] [--lean]
        [--out bench/flame-gateway.svg]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import wrk  # noqa: E402
from gateway import (  # noqa: E402
    free_port,
    measure,
    prepare_site,
    process,
    server_argv,
    simulated_engine,
    stat_cpu,
)

# The parts of a request's way through the gateway, by the function that runs each
# (inclusive: with what it calls), in the order a request meets them.
PARTS = {
    "uvicorn's HTTP protocol (parse, admit, write)": "HttpToolsProtocol.",
    "  the exchange (headers, id, record)": "asgi.<locals>.served",
    "    handle: auth, body, route, checks": "handle (openai_api/gateway.py",
    "      relay: slot, keepalive, in-flight": "relay (openai_api/relay.py",
    "        the engine's request and answer (aiohttp)": "requested (openai_api/forwarder.py",
    "        the answer passed on": "pass_on (openai_api/forwarder.py",
    "    the request's end (access line, metrics, usage)": "finish (openai_api/access.py",
    "threads (the access log's writer, the route table's check)": "Thread._bootstrap ",
}


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: make setup (a dev dependency)")
    return found


def summary(raw: Path) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Shares of the samples: each part's (inclusive), and the top modules' own."""
    total = 0
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        frames = stack.split(";")
        for part, marker in PARTS.items():
            if any(frame.startswith(marker) for frame in frames):
                parts[part] += samples
        found = re.search(r"\((.*?):\d+\)", frames[-1])
        module = re.sub(r".*site-packages/", "", found.group(1)) if found else frames[-1]
        own[module] += samples
    share = {part: 100 * parts[part] / total for part in PARTS}
    return share, [(m, 100 * n / total) for m, n in own.most_common(20)]


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each of a process's threads so far (Linux /proc)."""
    tasks = Path(f"/proc/{pid}/task")
    return {tid: stat_cpu(tasks / tid / "stat") for tid in os.listdir(tasks)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lean", action="store_true", help="the access log off")
    parser.add_argument(
        "--out",
        default=str(REPO / "bench" / "flame-gateway.svg"),
        help="the flame graph (and its folded samples beside it, .txt); '-': kept nowhere",
    )
    args = parser.parse_args()
    if not wrk.available():
        raise SystemExit("wrk is not installed: apt-get install wrk")
    spy = py_spy()
    port, engine_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(simulated_engine(engine_port, 0), dict(os.environ), engine + "/health"),
    ):
        graph = Path(tmp) / "flame.svg" if args.out == "-" else Path(args.out)
        env, key = prepare_site(Path(tmp), engine, engine)
        env["MSHIP_ACCESS_LOG"] = "off" if args.lean else "json"
        argv = server_argv("modelship", "modelship_site.asgi:application", port)
        with process(argv, env, f"http://127.0.0.1:{port}/v1/models") as pid:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            headers = {"authorization": f"Bearer {key}"}
            measure("wrk", url, headers, 4, 1.0)  # warm up
            raw = Path(tmp) / "raw.txt"
            record = [spy, "record", "-p", str(pid), "-d", str(args.seconds), "-r", "250"]
            samplers = [
                subprocess.Popen(
                    [*record, "--nonblocking", "-f", form, "-o", str(out)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for form, out in (("raw", raw), ("flamegraph", graph))
            ]
            before = thread_cpu(pid)
            found = measure("wrk", url, headers, args.concurrency, args.seconds, pid)
            after = thread_cpu(pid)
            for sampler in samplers:
                sampler.wait(60)
        parts, modules = summary(raw)
        if args.out != "-":
            shutil.copy(raw, graph.with_suffix(".txt"))  # the samples, folded
    print(f"c={args.concurrency}: " + json.dumps({k: round(v, 1) for k, v in found.items()}))
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    main_share = 100 * spent.get(str(pid), 0.0) / max(sum(spent.values()), 1e-9)
    # py-spy samples a thread that waits for a core as running: on two busy cores the
    # threads' samples overstate what they spend, which /proc tells.
    print(f"the event loop's thread: {main_share:.1f}% of the server's CPU (/proc)")
    print(f"flame graph: {args.out}\n\n| part of the request's way | share of samples |")
    print("| --- | --- |")
    for part, share in parts.items():
        print(f"| {part.strip()} | {share:.1f}% |")
    print("\n| module (own samples) | share |\n| --- | --- |")
    for module, share in modules:
        print(f"| {module} | {share:.1f}% |")


if __name__ == "__main__":
    main()
