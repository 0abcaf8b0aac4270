"""The suite on both cores (pytest-xdist, `make test`): each worker gets a site of its own
before Django reads its settings, so that two workers never share what is the site's on this
host: the django-q queue, the site's label on Docker and Ray, the Redis database (rate limits,
the channel layer, the broker). pytest-django gives each worker its own test database.

Loaded with `-p tests.parallel_env` (tests/conftest.py refuses a worker without it): a plugin
named there is imported before pytest-django configures Django, a conftest only after."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from xdist.scheduler import LoadScopeScheduling

if TYPE_CHECKING:
    from collections.abc import Mapping

ROOT = Path(__file__).resolve().parent.parent
# The test modules that share one engine or cluster started for the session run on one worker,
# so that it is started once per run: the fixture that starts it, to the group's name. A
# module asks for it as a parameter (`ray_cluster: Cluster`) of a test or of its own fixture.
SHARED_SESSION_FIXTURES = {"ray_cluster": "ray"}


def worker_number(env: Mapping[str, str]) -> int | None:
    """Which xdist worker this process is (gw0 is 0), or None outside xdist."""
    name = env.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw") or not name[2:].isdigit():
        return None
    return int(name[2:])


def outside_xdist(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a pytest run of its own started by a test: not a worker of this one."""
    return {k: v for k, v in env.items() if not k.startswith("PYTEST_XDIST")}


# Redis's own default (`databases 16`): a worker past it would fail at its first command.
REDIS_DATABASES = 16


def redis_db_of(url: str, worker: int) -> str:
    """The Redis URL of a worker: the database after the run's own, one per worker (the run's
    own, 0 by default, is left to a run without workers)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    first = int(path) if path.isdigit() else 0
    number = first + 1 + worker
    if number >= REDIS_DATABASES:
        raise pytest.UsageError(
            f"worker gw{worker} would need Redis database {number}; Redis has "
            f"{REDIS_DATABASES}: fewer workers (TEST_WORKERS) or a lower database in REDIS_URL"
        )
    return urlunsplit(parts._replace(path=f"/{number}"))


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a worker sets in its environment before Django starts: nothing outside xdist."""
    worker = worker_number(env)
    if worker is None:
        return {}
    tag = f"-gw{worker}"
    changes = {
        "MSHIP_Q_NAME": env.get("MSHIP_Q_NAME", "modelship") + tag,
        "MSHIP_SITE": env.get("MSHIP_SITE", "modelship") + tag,
    }
    if env.get("REDIS_URL"):
        changes["REDIS_URL"] = redis_db_of(env["REDIS_URL"], worker)
    return changes


os.environ.update(worker_env(os.environ))


@functools.cache
def group_of_module(path: str) -> str:
    """The unit of work a worker takes whole: a test module, or the modules that ask for a
    session's shared cluster. Decided from the module's source, since xdist's controller,
    which schedules, collects no tests and sees no fixtures."""
    try:
        source = (ROOT / path).read_text()
    except OSError:
        return path
    for fixture, group in SHARED_SESSION_FIXTURES.items():
        if re.search(rf"\b{fixture}\s*[:,)]", source):
            return group
    return path


def group_of(nodeid: str) -> str:
    return group_of_module(nodeid.partition("::")[0])


class ModuleGroups(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    """xdist's scope scheduling (a unit of work goes whole to one worker), with our units.
    Not `--dist loadgroup`: it marks a group by renaming each test (`item._nodeid`), which
    pytest 9 no longer reads (a test's name comes from its `_id`), so every test became a unit
    of its own and the Ray tests ran on both workers, each with a cluster of its own."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getoption("dist") != "loadscope":
        return None
    return ModuleGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The groups that hold a heavy suite first (`--no-loadscope-reorder`): the minutes of a
    real engine are not the last thing a worker does while the other waits. After
    pytest-django's own order (database tests first), which is kept within each group, and
    before xdist's worker reports the collection."""
    items = session.items
    heavy = {group_of(item.nodeid) for item in items if item.get_closest_marker("heavy")}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(group_of(item.nodeid), index)
    items.sort(key=lambda item: (group_of(item.nodeid) not in heavy, first[group_of(item.nodeid)]))
