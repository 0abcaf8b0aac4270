"""A Modelship served as `make run` serves it (`manage.py serve`: the ASGI server and the
django-q cluster), on this test's database, for tests that drive it from outside: the CLI,
a browser."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from django_q.conf import Conf

from deployments.runtimes.process import free_port
from tests.conftest import REPO, answers, env_for_subprocess, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def live_env() -> dict[str, str]:
    """What a test adds to the served site's environment (parametrize it to change)."""
    return {}


@pytest.fixture
def live(
    site: Any, tmp_path: Path, transactional_db: None, live_env: dict[str, str]
) -> Iterator[dict[str, str]]:
    """The served site's environment: MSHIP_URL, and what the CLI reads."""
    port = free_port("127.0.0.1")
    var = tmp_path / "var"
    env = env_for_subprocess(
        MSHIP_VAR_DIR=str(var),
        MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
        MSHIP_ENGINE_LOG_DIR=str(site.MSHIP_ENGINE_LOG_DIR),
        MSHIP_MEMORY_CAPACITY_GIB="8",
        MSHIP_Q_NAME=Conf.PREFIX,
        **live_env,
    )
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url + "/health"), 60)
        wait_until(lambda: (var / "api_key").exists(), 30)
        # The CLI finds the token and the key where `make run` keeps them (var/).
        yield {**env, "MSHIP_URL": url, "MSHIP_TOKEN": "", "MSHIP_API_KEY": ""}
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:  # a hung shutdown leaves nothing running
            serve.kill()
            serve.wait()
