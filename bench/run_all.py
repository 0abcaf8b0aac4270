"""Run every benchmark of the performance issue, one after another (a smoke run: several at
once), and write what each printed to bench/results.md (about twenty minutes on the
project's 2-core machine).

    .venv/bin/python bench/run_all.py            # make bench
    .venv/bin/python bench/run_all.py --smoke    # each once at a tiny size (make test runs it)

`--smoke` is a regression guard, not a measurement: each script must complete with no
errors and its counters back at zero (the scripts exit 1 otherwise); no time is asserted.
It runs SMOKE_JOBS scripts at once (`--jobs`), each on a site of its own (a temporary
folder, free ports); a measurement runs one at a time, alone on the machine. The report
keeps RUNS' order either way. Exits 1 when any script failed, after running the rest.

Each script's site starts from one SQLite database migrated here first (bench/site_db.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import site_db  # noqa: E402

# (title, script and arguments for the measurement, the same at smoke size: None where the
# smoke run above covers it)
RUNS: list[tuple[str, list[str], list[str] | None]] = [
    (
        "A simulated fleet: 10 nodes x 8 GPUs, 100 models, a day (the real controller)",
        ["fleet.py"],
        ["fleet.py", "--hours", "0.25", "--deployments", "10", "--nodes", "2"],
    ),
    (
        "The scheduler on a replayed day: Modelship's against FIFO + LRU (the real controller)",
        ["scheduler.py"],
        ["scheduler.py", "--hours", "0.5"],
    ),
    (
        "The same trace through the site's scheduler: 4 gateway processes against one,"
        " time compressed (the real owner, link and controller)",
        ["scheduler_site.py"],
        ["scheduler_site.py", "--hours", "0.05", "--speed", "360", "--gateways", "2"],
    ),
    (
        "The /v1 gateway against the engine and the yardstick under wrk: `make run`'s server"
        " (access log on), the same with the log off, and `make run`'s own `serve`",
        [
            *("gateway.py", "--seconds", "8", "--rounds", "2"),
            *("--servers", "modelship,modelship-lean,modelship-run"),
        ],
        [
            *("gateway.py", "--seconds", "0.2", "--concurrency", "4", "--driver", "python"),
            *("--servers", "modelship,modelship-w2,modelship-run"),
            *("--warm-up", "0", "--stream-tokens", "50"),
        ],
    ),
    (
        "Where the gateway's CPU goes under wrk (c=32, py-spy; bench/flame-gateway.svg)",
        ["flame.py", "--seconds", "10"],
        ["flame.py", "--seconds", "1", "--out", "-", "--warm-up", "0"],
    ),
    (
        "What recording usage and tracing cost the gateway (c=32)",
        ["usage_cost.py", "--seconds", "5", "--rounds", "3"],
        [
            *("usage_cost.py", "--seconds", "0.2", "--rounds", "1", "--driver", "python"),
            *("--warm-up", "0", "--finish-requests", "2000"),
        ],
    ),
    (
        "The route table's check on the connection its thread keeps, against a new one each"
        " check (SQLite; --postgres for a server)",
        ["route_table_checks.py"],
        ["route_table_checks.py", "--checks", "20", "--rounds", "1"],
    ),
    (
        "A decision (a max_concurrency place, an on-demand slot, a replica of two) in the"
        " gateway's own process against a hop to the site's scheduler process",
        ["scheduler_hop.py"],
        ["scheduler_hop.py", "--requests", "100", "--rounds", "1"],
    ),
    (
        "One gateway process against two (`serve --workers 2`), the same machine's cores",
        ["gateway.py", "--seconds", "4", "--servers", "modelship,modelship-w2"],
        None,  # the smoke run above serves both
    ),
    (
        "Cache-aware routing: three llama.cpp replicas of SmolLM2, conversations under long"
        " system prompts, by policy",
        ["prefix_routing.py"],
        [
            *("prefix_routing.py", "--tenants", "2", "--conversations", "2", "--turns", "2"),
            *("--system-words", "40", "--policies", "least-outstanding,cache-aware"),
            *("--stagger", "0.2", "--think", "0.1", "--replicas", "2"),
        ],
    ),
    (
        "A conversation's KV cache across a swap: SmolLM2 on llama.cpp swapped out by another"
        " on-demand model between two turns, restored against computed again",
        ["kv_resume.py"],
        ["kv_resume.py", "--tokens", "300"],
    ),
    (
        "On-demand cold start, the simulated engine",
        ["cold_start.py", "--runs", "5"],
        ["cold_start.py", "--runs", "1"],
    ),
    (
        "On-demand cold start and streamed tokens, the tiny GGUF on llama.cpp",
        ["cold_start.py", "--runs", "5", "--engine", "tiny"],
        ["cold_start.py", "--runs", "1", "--engine", "tiny", "--tokens", "100"],
    ),
    (
        "A burst of 1,000 first requests to a stopped on-demand model",
        ["cold_burst.py", "--clients", "1000"],
        ["cold_burst.py", "--clients", "20", "--startup-delay", "0.2"],
    ),
    (
        "1,000 open streams held for three minutes",
        ["soak.py", "--streams", "1000", "--minutes", "3"],
        [
            "soak.py",
            "--streams",
            "20",
            "--minutes",
            "0.02",
            "--sample-every",
            "1",
            "--tokens-per-stream",
            "3",
            "--tokens-per-second",
            "5",
        ],
    ),
    (
        "The Responses API over its WebSocket against SSE",
        ["responses_socket.py", "--rounds", "3"],
        ["responses_socket.py", "--rounds", "1", "--tokens", "50", "--turns", "4"],
    ),
    (
        "The worst bodies the gateway reads: the depth scan and a punycode form field",
        ["body_scans.py", "--old"],
        ["body_scans.py", "--smoke"],
    ),
    (
        "The anchor: a LiteLLM proxy on the same engine",
        ["litellm_anchor.py", "--seconds", "8", "--rounds", "2"],
        [
            *("litellm_anchor.py", "--seconds", "0.3", "--rounds", "1", "--concurrency", "4"),
            *("--warm-up", "0"),
        ],
    ),
]

# Each script sets up its own site (SQLite in a temporary folder): nothing of the caller's.
NOT_PASSED = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR", "DJANGO_SETTINGS_MODULE")

# Scripts at once in a smoke run: a third keeps both cores busy while another waits (an
# engine's health, streams paced by the clock); a fourth only contends for them (the same
# wall time, measured).
SMOKE_JOBS = 3
# The longest smoke runs start first (longest first), so none is left to run alone at the end.
SLOW_FIRST = (
    "litellm_anchor.py",
    "gateway.py",
    "prefix_routing.py",
    "usage_cost.py",
    "kv_resume.py",
)


def passed_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    env["MSHIP_ACCESS_LOG"] = "off"  # the servers' access lines would fill the report
    return env


def run(argv: list[str], timeout: float, template: Path) -> tuple[int, str, float]:
    env = {**passed_env(), site_db.TEMPLATE: str(template)}
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / argv[0]), *argv[1:]],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n(timed out after {timeout:.0f} s)", time.monotonic() - began
    output = done.stdout + ("\n" + done.stderr[-3000:] if done.returncode else "")
    return done.returncode, output, time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="each once, at a tiny size")
    parser.add_argument("--out", help="where to write the results (default: bench/results.md)")
    parser.add_argument("--only", help="run the scripts whose name contains this")
    parser.add_argument(
        "--jobs",
        type=int,
        help=f"scripts at once (default: {SMOKE_JOBS} with --smoke, else 1: a measurement"
        " wants the machine to itself)",
    )
    args = parser.parse_args()
    jobs = args.jobs or (SMOKE_JOBS if args.smoke else 1)
    out = Path(args.out) if args.out else BENCH / ("smoke.md" if args.smoke else "results.md")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Benchmark results" + (" (smoke: tiny sizes, not a measurement)" if args.smoke else ""),
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit or 'unknown'}, on"
        f" {os.cpu_count()} cores ({platform.processor() or platform.machine()}), Python"
        f" {platform.python_version()}. Written by `bench/run_all.py`; what each figure means"
        " is in bench/README.md.",
    ]
    chosen = [
        (title, argv)
        for title, full, smoke in RUNS
        if (argv := smoke if args.smoke else full) is not None
        and not (args.only and args.only not in argv[0])
    ]
    # Started in this order (the slow ones first where several run at once); reported in
    # RUNS' order.
    slow = {name: rank for rank, name in enumerate(SLOW_FIRST)} if jobs > 1 else {}
    order = sorted(range(len(chosen)), key=lambda i: slow.get(chosen[i][1][0], len(slow)))
    failed = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ms-bench-") as tmp:
        template = Path(tmp) / "template.sqlite3"
        site_db.make(template, passed_env())

        def one(i: int) -> tuple[int, str, float]:
            argv = chosen[i][1]
            code, output, took = run(argv, 600 if args.smoke else 1200, template)
            print(f"{argv[0]}: exit {code} in {took:.0f} s", flush=True)
            return code, output, took

        with ThreadPoolExecutor(jobs) as pool:
            done = dict(zip(order, pool.map(one, order), strict=True))
    for i, (title, argv) in enumerate(chosen):
        code, output, took = done[i]
        lines += ["", f"## {title}", "", f"`{' '.join(['bench/' + argv[0], *argv[1:]])}`"]
        lines += [f"(exit {code}, {took:.0f} s)", "", output.strip()]
        if code:
            failed.append(argv[0])
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out} ({time.monotonic() - began:.0f} s, {jobs} at once)")
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
