"""`make run`'s shape for bench/gateway.py's `modelship-run` target: `manage.py serve` with
its django-q cluster and autoscaler beside the server, the access log on, and the engines
started and watched by Modelship itself (simulated ones, as `make run`'s sim-chat), from a
models.yaml. It runs on a copy of the bench site's database as it was before its deployments
were added (KEYS_ONLY, which bench/gateway.py's prepare_site leaves), so the bench's key
works there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parent.parent

MODELS = {
    "models": [
        {
            "name": name,
            "model": "simulated",
            "loader": "simulated",
            "usecase": "generate",
            "runtime": "process",
            "mode": "always_on",
            "memory_gib": 1,
            "simulated_config": {"tokens_per_second": pace},
        }
        for name, pace in (("bench", 0), ("bench-stream", 1000))
    ]
}
# The bench site's database with its key and none of its deployments (their rows point at
# engines the bench started; this site starts its own): a copy, not a Django process of its
# own to delete them.
KEYS_ONLY = "bench-keys-only.sqlite3"


def server_pid(serve_pid: int) -> int:
    """The uvicorn server `serve` started (its child): the gateway measured, not the
    cluster's processes or the engines beside it."""
    for child in Path(f"/proc/{serve_pid}/task/{serve_pid}/children").read_text().split():
        if "modelship_site.server" in Path(f"/proc/{child}/cmdline").read_text():
            return int(child)
    raise SystemExit("`serve` runs no server process")


@contextmanager
def serve(env: dict[str, str], port: int, key: str) -> Iterator[int]:
    """`serve` up with both bench models ready; yields its server process's pid."""
    with tempfile.TemporaryDirectory() as own:
        site = Path(own)
        shutil.copy(Path(env["MSHIP_VAR_DIR"]) / KEYS_ONLY, site / "bench.sqlite3")
        models = site / "models.yaml"
        models.write_text(json.dumps(MODELS))  # JSON is YAML
        run_env = {
            **env,
            "DATABASE_URL": f"sqlite:///{site / 'bench.sqlite3'}",
            "MSHIP_VAR_DIR": str(site),
        }
        argv = [sys.executable, "manage.py", "serve", "--port", str(port)]
        proc = subprocess.Popen(
            [*argv, "--models", str(models)],
            env=run_env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ready(f"http://127.0.0.1:{port}", key)
            yield server_pid(proc.pid)
        finally:
            proc.terminate()  # it stops its engines on its way out
            proc.wait(60)


def ready(url: str, key: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    waiting = ["bench", "bench-stream"]
    while waiting and time.monotonic() < deadline:
        try:
            body["model"] = waiting[0]
            if httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers).is_success:
                waiting.pop(0)
                continue
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    if waiting:
        raise SystemExit(f"`serve` did not make {waiting} ready in {timeout:.0f} s")
