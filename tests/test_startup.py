"""What a Modelship process loads when it starts: every `serve`, its workers and every
manage.py pays for it, so the engines' servers (numpy, Twisted) stay out of it, and
`manage.py runserver` still serves ASGI on Daphne, loaded only there."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from deployments.runtimes.process import free_port
from tests.conftest import REPO, answers, env_for_subprocess, wait_until

# What the gateway's process has no use for at its start (together about 2 s of CPU a process).
NOT_LOADED = (
    *("twisted", "daphne", "numpy", "mcp", "docker", "redis"),
    "deployments.engines.whisper_server",
)

PROBE = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
import django
django.setup()
import modelship_site.server, modelship_site.asgi, deployments.operations, deployments.loaders
loaded = {n for n in {NAMES} for m in sys.modules if m == n or m.startswith(n + ".")}
print(" ".join(sorted(loaded)))
"""


pytestmark = [pytest.mark.redis]


def test_it_loads_no_engine_server_nor_twisted_in_a_modelship_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.replace("{NAMES}", repr(NOT_LOADED))],
        cwd=REPO,
        # A site without Redis (the PostgreSQL run sets it: that site loads its client at start).
        env={k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


@pytest.mark.django_db(transaction=True)
def test_it_serves_the_site_on_daphne_under_runserver() -> None:
    port = free_port("127.0.0.1")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=REPO,
        env=env_for_subprocess(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or answers(url + "/health"), 60)
        assert process.poll() is None, process.communicate()[0]
        health = httpx.get(url + "/health")
        assert health.status_code == 200
        assert health.headers["server"] == "daphne"
    finally:
        process.terminate()
        out = process.communicate(timeout=30)[0]
    assert "Starting ASGI/Daphne" in out
