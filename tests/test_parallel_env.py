"""The suite's workers (pytest-xdist) each on a site of their own: tests/parallel_env.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.parallel_env import (
    group_of,
    outside_xdist,
    redis_db_of,
    worker_env,
    worker_number,
)


def test_it_changes_nothing_outside_xdist() -> None:
    assert worker_number({}) is None
    assert worker_env({"MSHIP_Q_NAME": "q", "REDIS_URL": "redis://h:6379/0"}) == {}
    assert worker_env({"PYTEST_XDIST_WORKER": "master"}) == {}


def test_it_gives_each_worker_its_own_queue_site_and_redis_database() -> None:
    base = {"MSHIP_Q_NAME": "modelship-test", "REDIS_URL": "redis://127.0.0.1:6379/0"}
    first = worker_env({**base, "PYTEST_XDIST_WORKER": "gw0"})
    second = worker_env({**base, "PYTEST_XDIST_WORKER": "gw1"})
    assert first == {
        "MSHIP_Q_NAME": "modelship-test-gw0",
        "MSHIP_SITE": "modelship-gw0",
        "REDIS_URL": "redis://127.0.0.1:6379/1",
    }
    assert second["REDIS_URL"] == "redis://127.0.0.1:6379/2"
    assert {first["MSHIP_SITE"], second["MSHIP_SITE"]} == {"modelship-gw0", "modelship-gw1"}
    # Without Redis, none is named.
    assert "REDIS_URL" not in worker_env({"PYTEST_XDIST_WORKER": "gw3"})


def test_it_counts_the_redis_database_from_the_runs_own() -> None:
    assert redis_db_of("redis://:secret@cache:6380/4", 1) == "redis://:secret@cache:6380/6"
    assert redis_db_of("redis://cache", 0) == "redis://cache/1"
    assert redis_db_of("rediss://cache:6380/2?ssl_cert_reqs=none", 0) == (
        "rediss://cache:6380/3?ssl_cert_reqs=none"
    )


def test_it_refuses_more_workers_than_redis_has_databases() -> None:
    assert redis_db_of("redis://cache/0", 14) == "redis://cache/15"
    with pytest.raises(pytest.UsageError, match="Redis database 16"):
        redis_db_of("redis://cache/0", 15)
    with pytest.raises(pytest.UsageError, match="TEST_WORKERS"):
        redis_db_of("redis://cache/10", 5)


def test_it_runs_on_a_site_of_its_own_under_xdist(settings: object) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    site = str(getattr(settings, "MSHIP_SITE", ""))
    if worker:
        assert site.endswith(f"-{worker}")
    else:
        assert "-gw" not in site


def test_it_refuses_a_worker_that_lacks_the_plugin() -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"), "tests/test_env.py"),
        ],
        cwd=REPO,
        env={**outside_xdist(os.environ), "PYTEST_XDIST_WORKER": "gw0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "-p tests.parallel_env" in done.stdout + done.stderr


def test_it_sends_the_modules_sharing_the_ray_cluster_to_one_worker() -> None:
    shared = {
        group_of(f"tests/{name}.py::test_x")
        for name in ("test_ray_runtime", "test_ray_deployments", "test_ray_secrets")
    }
    assert shared == {"ray"}
    # A module that names deployments.ray_cluster, not the fixture, is a unit of its own.
    assert group_of("tests/test_ray_config.py::test_x") == "tests/test_ray_config.py"
    assert group_of("tests/test_env.py::test_x[a::b]") == "tests/test_env.py"
