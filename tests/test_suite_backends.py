"""The suite's own rule: a test runs again on PostgreSQL + Redis only when it is marked as
exercising what differs there (postgres, redis) or as its API family's sample; one that uses
the database, Redis or the channel layer without saying so fails loudly instead of quietly
running on one back-end only, as does one skipped on SQLite for PostgreSQL's sake."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.conftest import REPO
from tests.parallel_env import outside_xdist

if TYPE_CHECKING:
    from pathlib import Path

INNER = '''
import pytest
import redis
from channels.layers import get_channel_layer
from deployments.models import Deployment


@pytest.fixture(scope="session", autouse=True)
def unblocked(request):
    """As a server started for the session does: the ORM unblocked for every test after."""
    request.getfixturevalue("django_db_setup")
    with request.getfixturevalue("django_db_blocker").unblock():
        yield


def test_it_forgets_that_it_reads_the_database():
    assert Deployment.objects.count() == 0


def test_it_forgets_that_it_uses_the_channel_layer():
    assert get_channel_layer() is not None


def test_it_forgets_that_it_uses_redis(db):
    redis.Redis.from_url("redis://127.0.0.1:6379/0")


@pytest.mark.redis
def test_it_says_that_it_uses_the_channel_layer():
    assert get_channel_layer() is not None


def test_it_touches_nothing():
    assert 1 + 1 == 2


@pytest.mark.skipif(True, reason="advisory locks are PostgreSQL's")
def test_it_forgets_that_it_needs_postgresql():
    pass


@pytest.mark.postgres
@pytest.mark.skipif(True, reason="advisory locks are PostgreSQL's")
def test_it_says_that_it_needs_postgresql():
    pass


@pytest.mark.sample("chat")
def test_it_is_a_sample(db):
    assert Deployment.objects.count() == 0
'''


# The suite's rule, as its conftest gives it to every test.
CONFTEST = """
from tests.conftest import backend_guard, pytest_collection_modifyitems
from tests.conftest import pytest_report_collectionfinish, pytest_runtest_makereport
"""
# A run of the whole (inner) suite, as `make test` runs it: no paths named.
INI = """
[pytest]
DJANGO_SETTINGS_MODULE = modelship_site.settings
python_functions = test_it_*
asyncio_default_fixture_loop_scope = function
markers =
    postgres: -
    redis: -
    sample: -
testpaths = {here}
"""


def inner_run(tmp_path: Path, *args: str, **env: str) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text(INI.format(here=tmp_path))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(  # from its own folder: where the ini's testpaths count
        [*argv, "-c", str(tmp_path / "pytest.ini"), *args],
        cwd=tmp_path,
        env={**outside_xdist(os.environ), "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout + done.stderr


def test_it_fails_a_test_that_uses_what_it_did_not_say(tmp_path: Path) -> None:
    out = inner_run(tmp_path, str(tmp_path))
    assert "test_it_forgets_that_it_reads_the_database uses the database" in out
    assert "give it the db fixture" in out
    assert "test_it_forgets_that_it_uses_the_channel_layer uses the channel layer" in out
    assert (
        "test_it_forgets_that_it_uses_redis uses Redis: mark it @pytest.mark.redis (it runs" in out
    )
    assert "test_it_forgets_that_it_needs_postgresql is skipped here" in out
    assert "3 failed, 3 passed, 1 skipped, 1 error" in out  # the skip fails as its setup
    assert "3 tests run on each back-end, 5 on this one alone" in out


def test_it_runs_only_the_marked_tests_on_the_second_backend(tmp_path: Path) -> None:
    out = inner_run(tmp_path, str(tmp_path), MSHIP_TEST_BACKENDS_ONLY="1")
    assert "2 passed, 1 skipped, 5 deselected" in out


def test_it_refuses_a_second_backend_run_missing_an_api_familys_sample(tmp_path: Path) -> None:
    out = inner_run(tmp_path, MSHIP_TEST_BACKENDS_ONLY="1")
    assert "no test of the API families ['admin', 'audio'," in out
    assert "'chat'" not in out.partition("no test of the API families")[2].splitlines()[0]
