"""Benchmark: what recording usage and tracing cost the gateway (README, "Usage and
budgets", "Traces").

One simulated engine (no pacing) and the gateway as `make run` serves it, started again for
each configuration in turn, several rounds, in one run: recording off (MSHIP_USAGE_RECORD=0),
recording on (the default), recording on for a key with budgets (checked on every request,
counted at its end), and traces on besides (every request a trace, exported to a collector
stand-in in this process that takes and drops them). Requests per second and the server's
CPU per request at concurrency 32; the figures are each configuration's median over the
rounds, and the ratios are against "off".

    .venv/bin/python bench/usage_cost.py [--seconds 5] [--rounds 3] [--json out.json]
        [--warm-up 1] [--finish-requests 20000]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import wrk  # noqa: E402
from bench.gateway import measure, serving, simulated_site  # noqa: E402

CONFIGS = {
    "off": {"MSHIP_USAGE_RECORD": "0"},
    "on": {"MSHIP_USAGE_RECORD": "1"},
    "on, budgets": {"MSHIP_USAGE_RECORD": "1"},
    "on, traces": {"MSHIP_USAGE_RECORD": "1"},  # the collector's address is added below
}


def budgeted_key_and_engine(env: dict[str, str]) -> tuple[str, str]:
    """A key with budgets, and the engine the site routes `bench` to (simulated_site made
    it), from this process's Django on the site's database: the one start-up that
    finish_cost's loops use later, not a process each."""
    for name in ("DATABASE_URL", "MSHIP_VAR_DIR", "DJANGO_SETTINGS_MODULE"):
        os.environ[name] = env[name]
    os.environ["MSHIP_ACCESS_LOG"] = "off"  # as finish_cost wants it, read once at set-up
    import django  # noqa: PLC0415 - once the site's environment is this process's

    django.setup()
    from django.db import connection  # noqa: PLC0415 - after django.setup()

    from deployments.models import Deployment  # noqa: PLC0415 - after django.setup()
    from openai_api.models import ApiKey  # noqa: PLC0415 - after django.setup()

    _, key = ApiKey.issue(
        "budgeted", requests_per_minute=10**9, tokens_per_day=10**15, requests_per_day=10**12
    )
    engine = Deployment.objects.get(name="bench").engine_urls[0]
    connection.close()  # nothing of this process holds the site's database while it is served
    return key, engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--warm-up", type=float, default=1.0, help="seconds of load at c=4 first (0: none)"
    )
    parser.add_argument(
        "--finish-requests",
        type=int,
        default=20000,
        help="requests' ends timed in this process, per run of each way",
    )
    parser.add_argument("--json", help="also write the results here")
    wrk.driver_option(parser)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    with simulated_site(0) as (_, env, key), collector() as traces:
        budgeted, engine = budgeted_key_and_engine(env)
        keys = {"off": key, "on": key, "on, budgets": budgeted, "on, traces": key}
        CONFIGS["on, traces"]["OTEL_EXPORTER_OTLP_ENDPOINT"] = traces
        names = list(CONFIGS)
        for round_ in range(args.rounds):
            # Each round in another order: no configuration always follows the same one.
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                extra = CONFIGS[name]
                headers = {"authorization": f"Bearer {keys[name]}"}
                with serving("gateway", "modelship", {**env, **extra}, engine) as (url, pid):
                    target = url + "/v1/chat/completions"
                    if args.warm_up:
                        measure(args.driver, target, headers, 4, args.warm_up)
                    measured = measure(
                        args.driver, target, headers, args.concurrency, args.seconds, pid
                    )
                runs[name].append(measured)
                print(name, json.dumps(measured), flush=True)
        # This process's Django is the site's: its folder (the metrics' files, the database
        # a usage flush would reach) is there until the site ends.
        in_process = finish_cost(args.finish_requests)
    results = summary(runs)
    report(results, args.concurrency)
    print(
        f"\nIn process, one request's end (access.finish): {in_process['off_us']:.1f} µs with"
        f" recording off, {in_process['on_us']:.1f} µs on; the tracing calls of a request"
        f" with tracing off: {in_process['tracing_off_us']:.2f} µs"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "in_process": in_process}, indent=2))


def finish_cost(requests: int = 20000) -> dict[str, float]:
    """What the end of one request costs this process, recording off and on (the median of
    three alternating runs each), and what a request's tracing calls cost with tracing off:
    steadier figures than a rate on two shared cores."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
    os.environ["MSHIP_ACCESS_LOG"] = "off"
    import django  # noqa: PLC0415

    django.setup()
    from django.conf import settings  # noqa: PLC0415

    from common import tracing  # noqa: PLC0415
    from openai_api import access  # noqa: PLC0415
    from openai_api.catalog import Key  # noqa: PLC0415
    from openai_api.usage.ledger import ledger  # noqa: PLC0415

    ledger.stop.set()  # added up in memory only: nothing is written here
    key = Key(1, "bench", "abcd1234", "", False, frozenset(), None)
    answer = (
        b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":"hello"},"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":1,"completion_tokens":16,"total_tokens":17}}'
    )

    def one() -> None:
        record = access.RequestRecord("POST", "/v1/chat/completions", "bench")
        record.model, record.endpoint, record.key_ref = "bench", "chat/completions", key
        record.status = 200
        record.sent(answer)
        access.finish(record)

    def timed(recording: bool) -> float:
        settings.MSHIP_USAGE_RECORD = recording
        began = time.perf_counter()
        for _ in range(requests):
            one()
        return (time.perf_counter() - began) / requests * 1e6

    def traced_calls() -> None:
        with tracing.span("a"), tracing.span("b"), tracing.client_span("c"):
            tracing.inject({})

    timed(True)  # warm
    off, on = [], []
    for _ in range(3):
        off.append(timed(False))
        on.append(timed(True))
    began = time.perf_counter()
    for _ in range(requests):
        traced_calls()
    tracing_off = (time.perf_counter() - began) / requests * 1e6
    ledger.rows.clear()
    return {
        "off_us": statistics.median(off),
        "on_us": statistics.median(on),
        "tracing_off_us": tracing_off,
    }


@contextmanager
def collector() -> Iterator[str]:
    """An OTLP/HTTP endpoint that takes every export and keeps nothing: its base URL."""

    class Drop(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drop)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def summary(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    medians = {
        name: {field: statistics.median(run[field] for run in rows) for field in rows[0]}
        for name, rows in runs.items()
    }
    base = medians["off"]
    for row in medians.values():
        row["rps_ratio"] = row["rps"] / base["rps"]
        row["cpu_ratio"] = row["cpu_us"] / base["cpu_us"]
    return medians


def report(results: dict[str, dict[str, Any]], concurrency: int) -> None:
    print()
    print(
        f"| usage recording, traces | c={concurrency} req/s | vs off | CPU µs/req | vs off"
        " | p99 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in results.items():
        print(
            f"| {name} | {row['rps']:,.0f} | {row['rps_ratio']:.3f} | {row['cpu_us']:,.0f} |"
            f" {row['cpu_ratio']:.3f} | {row['p99_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
