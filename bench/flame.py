"""Profile the gateway under wrk: where its CPU per request goes.

The gateway as `make run` serves it (modelship_site.server, access log on unless --lean) in
front of the unpaced simulated engine, non-streaming chat from wrk at one concurrency, and
py-spy sampling the server process meanwhile. Writes a flame graph (SVG) and prints the
share of the samples each part of the request's way takes (inclusive), and each module's own
share, so what is left to take is named. The yardstick (bench/yardstick.py, the same uvicorn
and aiohttp with nothing of Modelship's) is sampled the same way, and the CPU per request of
both is split by whose code ran (Modelship's, aiohttp's, uvicorn's, asyncio's...): what the
libraries alone cost in the gateway against the yardstick's whole request.

    .venv/bin/python bench/flame.py [--seconds 10] [--concurrency 32] [--lean]
        [--out bench/flame-gateway.svg] [--warm-up 1]
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import wrk  # noqa: E402
from gateway import (  # noqa: E402
    free_port,
    loop_of,
    measure,
    prepare_site,
    process,
    server_argv,
    simulated_engine,
    stat_cpu,
)

THREAD_ROOT = "Thread._bootstrap (threading.py"  # the first frame of a thread but the main one

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
    "threads (the access log's writer, the route table's check)": THREAD_ROOT,
}

# Whose code a sample of the event loop's thread is in, by its innermost frame's path (the
# first that matches); another thread's samples are THREADS', whatever they run.
THREADS = "other threads (access log writer, route table check, executor)"
OWNERS = {
    "Modelship (openai_api, modelship_site, common, ...)": (
        r"^(openai_api|modelship_site|common|deployments|ondemand|bench)/"
    ),
    "aiohttp (with yarl, multidict)": r"^(aiohttp|yarl|multidict)/",
    "uvicorn (with httptools)": r"^(uvicorn|httptools)/",
    "asyncio (the loop, its waits, tasks)": r"^(asyncio|selectors|uvloop)/|runners\.py",
    "prometheus_client": r"^prometheus_client/",
    "Django": r"^django/",
    "the rest (stdlib, other packages)": r"",
}


@dataclass(frozen=True)
class Spent:
    """A server's CPU per request (µs), its event loop thread's part, and the owners' shares
    of that thread's samples (%)."""

    cpu_us: float
    loop_us: float
    owners: dict[str, float]


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: make setup (a dev dependency)")
    return found


def summary(raw: Path) -> tuple[dict[str, float], list[tuple[str, float]], dict[str, float]]:
    """Shares of the samples: each part's (inclusive), the top modules' own; and each
    owner's share of the event loop's thread's samples."""
    total = 0
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    owners: collections.Counter[str] = collections.Counter()
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
        owners[owner(frames, module)] += samples
    share = {part: 100 * parts[part] / total for part in PARTS}
    loop_total = max(total - owners[THREADS], 1)
    by_owner = {name: 100 * owners[name] / loop_total for name in OWNERS}
    return share, [(m, 100 * n / total) for m, n in own.most_common(20)], by_owner


def owner(frames: list[str], module: str) -> str:
    if frames[0].startswith(THREAD_ROOT):
        return THREADS
    return next(name for name, path in OWNERS.items() if re.search(path, module))


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each of a process's threads so far (Linux /proc)."""
    tasks = Path(f"/proc/{pid}/task")
    return {tid: stat_cpu(tasks / tid / "stat") for tid in os.listdir(tasks)}


def profile(
    spy: str,
    app: str,
    env: dict[str, str],
    key: str,
    seconds: int,
    concurrency: int,
    samples: Path,
    graph: Path | None,
    warm_up: float = 1.0,
) -> tuple[dict[str, float], float]:
    """`app` served as `make run` serves the gateway, warmed (`warm_up` s of load at c=4; 0:
    not), loaded by wrk and sampled by py-spy meanwhile (its folded samples to `samples`, a
    flame graph to `graph`): wrk's figures, and the share of the server's CPU its event
    loop's thread spent (/proc)."""
    port = free_port()
    argv = server_argv("modelship", app, port)
    # Both on the loop `make run` serves on (the yardstick's argv names it; the gateway reads
    # the setting, which the caller's environment could have changed).
    served_env = {**env, "MSHIP_SERVE_LOOP": loop_of("modelship")[1]}
    with process(argv, served_env, f"http://127.0.0.1:{port}/v1/models") as pid:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        headers = {"authorization": f"Bearer {key}"}
        if warm_up:
            measure("wrk", url, headers, 4, warm_up)
        record = [spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "250", "--nonblocking"]
        outputs = [("raw", samples)] + ([("flamegraph", graph)] if graph else [])
        samplers = [
            subprocess.Popen(
                [*record, "-f", form, "-o", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for form, out in outputs
        ]
        before = thread_cpu(pid)
        found = measure("wrk", url, headers, concurrency, seconds, pid)
        after = thread_cpu(pid)
        for sampler in samplers:
            sampler.wait(60)
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    return found, 100 * spent.get(str(pid), 0.0) / max(sum(spent.values()), 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lean", action="store_true", help="the access log off")
    parser.add_argument(
        "--warm-up", type=float, default=1.0, help="seconds of load at c=4 first (0: none)"
    )
    parser.add_argument(
        "--out",
        default=str(REPO / "bench" / "flame-gateway.svg"),
        help="the flame graph (its folded samples beside it, .txt, and the yardstick's,"
        " -yardstick.txt); '-': kept nowhere",
    )
    args = parser.parse_args()
    if not wrk.available():
        raise SystemExit("wrk is not installed: apt-get install wrk")
    spy = py_spy()
    engine_port = free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(simulated_engine(engine_port, 0), dict(os.environ), engine + "/health"),
    ):
        graph = Path(tmp) / "flame.svg" if args.out == "-" else Path(args.out)
        env, key = prepare_site(Path(tmp), engine, engine)
        env["MSHIP_ACCESS_LOG"] = "off" if args.lean else "json"
        load = (args.seconds, args.concurrency)
        raw, raw_yardstick = Path(tmp) / "raw.txt", Path(tmp) / "yardstick.txt"
        gateway = "modelship_site.asgi:application"
        found, main_share = profile(spy, gateway, env, key, *load, raw, graph, args.warm_up)
        yardstick_env = {**env, "YARDSTICK_UPSTREAM": engine}
        yardstick, yardstick_share = profile(
            spy, "bench.yardstick:app", yardstick_env, key, *load, raw_yardstick, None, args.warm_up
        )
        parts, modules, owners = summary(raw)
        _, _, yardstick_owners = summary(raw_yardstick)
        spent = [
            Spent(figures["cpu_us"], figures["cpu_us"] * share / 100, shares)
            for figures, share, shares in (
                (found, main_share, owners),
                (yardstick, yardstick_share, yardstick_owners),
            )
        ]
        if args.out != "-":
            shutil.copy(raw, graph.with_suffix(".txt"))  # the samples, folded
            shutil.copy(raw_yardstick, graph.with_name(f"{graph.stem}-yardstick.txt"))
    print(f"c={args.concurrency}: " + json.dumps({k: round(v, 1) for k, v in found.items()}))
    print("the yardstick: " + json.dumps({k: round(v, 1) for k, v in yardstick.items()}))
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
    print(owners_table(*spent))


def owners_table(gateway: Spent, yardstick: Spent) -> str:
    """CPU µs per request by whose code ran, the gateway beside the yardstick: each server's
    measured CPU per request, its event loop's thread's part (/proc) split by the shares of
    that thread's samples; the other threads' part as /proc has it (their samples overstate
    it: py-spy counts a thread waiting for a core as running)."""
    rows = [
        "",
        "| whose code (own samples) | gateway µs/req | yardstick µs/req |",
        "| --- | --- | --- |",
    ]
    for name in OWNERS:
        mine, theirs = (spent.loop_us * spent.owners[name] / 100 for spent in (gateway, yardstick))
        rows.append(f"| {name} | {mine:.0f} | {theirs:.0f} |")
    mine, theirs = (spent.cpu_us - spent.loop_us for spent in (gateway, yardstick))
    rows.append(f"| {THREADS} | {mine:.0f} | {theirs:.0f} |")
    rows.append(f"| all | {gateway.cpu_us:.0f} | {yardstick.cpu_us:.0f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
