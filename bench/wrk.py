"""Load from `wrk` (a C load generator, `apt-get install wrk`): the same non-streaming chat
requests as bench/gateway.py's Python driver, at a fraction of its CPU, so the client no
longer caps what two shared cores let the server do.

Its Lua script sets the method, the body and the headers, and prints one JSON line at the
end with the count, the errors and the latency percentiles wrk recorded (microseconds).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

SCRIPT = """\
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK {{"requests": %d, "duration_us": %d, "errors": %d, "non2xx": %d,'
    .. ' "p50_us": %d, "p99_us": %d}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def driver_option(parser: argparse.ArgumentParser) -> None:
    """A benchmark's `--driver`: wrk where it is installed, else the Python client."""
    parser.add_argument(
        "--driver",
        choices=["wrk", "python"],
        default="wrk" if available() else "python",
        help="the load generator: wrk (C, where installed) or aiohttp from this process",
    )


def lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII is a valid Lua string literal


def script(body: dict[str, object], headers: dict[str, str]) -> str:
    lines = "\n".join(
        f"wrk.headers[{lua_string(name)}] = {lua_string(value)}" for name, value in headers.items()
    )
    return SCRIPT.format(body=lua_string(json.dumps(body)), headers=lines)


def run(
    url: str, body: dict[str, object], headers: dict[str, str], concurrency: int, seconds: float
) -> dict[str, float]:
    """Requests per second and p50/p99 latency (ms) of `seconds` of load at `concurrency`
    connections; raises on any error or non-2xx answer (a refusal is not a measurement)."""
    threads = min(concurrency, 2)  # two cores: more threads only contend
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script(body, headers))
        lua.flush()
        # wrk takes whole seconds
        argv = [
            "wrk",
            "-t",
            str(threads),
            "-c",
            str(concurrency),
            "-d",
            f"{max(1, round(seconds))}s",
        ]
        done = subprocess.run(
            [*argv, "--timeout", "30s", "-s", lua.name, url], capture_output=True, text=True
        )
    if done.returncode:
        raise SystemExit(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("WRK "))
    found = json.loads(line.removeprefix("WRK "))
    if found["errors"] or found["non2xx"] or not found["requests"]:
        raise SystemExit(f"wrk at c={concurrency} against {url}: {found}\n{done.stdout}")
    return {
        "requests": float(found["requests"]),
        "rps": found["requests"] / (found["duration_us"] / 1e6),
        "p50_ms": found["p50_us"] / 1000,
        "p99_ms": found["p99_us"] / 1000,
    }
