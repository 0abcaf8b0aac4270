"""The suite's own rule: a test runs again on PostgreSQL + Redis only when it touches a
back-end, and one that touches a back-end without saying so fails loudly instead of quietly
running on one back-end only."""

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


@pytest.mark.backend
def test_it_says_that_it_uses_the_channel_layer():
    assert get_channel_layer() is not None


def test_it_touches_nothing():
    assert 1 + 1 == 2
'''


# The suite's rule, as its conftest gives it to every test.
CONFTEST = """
from tests.conftest import backend_guard, pytest_collection_modifyitems
from tests.conftest import pytest_report_collectionfinish
"""


def inner_run(tmp_path: Path, **env: str) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*argv, "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"), str(tmp_path)],
        cwd=REPO,
        env={**outside_xdist(os.environ), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout


def test_it_fails_a_test_that_touches_a_backend_without_saying_so(tmp_path: Path) -> None:
    out = inner_run(tmp_path)
    assert "test_it_forgets_that_it_reads_the_database uses the database" in out
    assert "test_it_forgets_that_it_uses_the_channel_layer uses the channel layer" in out
    assert "mark it @pytest.mark.backend or give it the db fixture" in out
    assert "2 failed, 2 passed" in out
    assert "1 tests touch the back-ends (run on each), 3 do not" in out


def test_it_runs_only_the_tests_that_touch_a_backend_on_the_second_one(tmp_path: Path) -> None:
    out = inner_run(tmp_path, MSHIP_TEST_BACKENDS_ONLY="1")
    assert "1 passed, 3 deselected" in out
