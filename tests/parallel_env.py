"""The suite on both cores (pytest-xdist, `make test`): each worker gets a site of its own
before Django reads its settings, so that two workers never share what is the site's on this
host: the django-q queue, the site's label on Docker and Ray, the Redis database (rate limits,
the channel layer, the broker). pytest-django gives each worker its own test database.

Loaded with `-p tests.parallel_env` (tests/conftest.py refuses a worker without it): a plugin
named there is imported before pytest-django configures Django, a conftest only after."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pytest

if TYPE_CHECKING:
    from collections.abc import Mapping

# The test modules that share one engine or cluster started for the session run on one worker,
# so that it is started once per run: the fixture that starts it, to the group's name.
SHARED_SESSION_FIXTURES = {"ray_cluster": "ray"}
GROUP = pytest.StashKey[str]()


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


def group_of(item: pytest.Item) -> str:
    """The unit of work a worker takes whole: a test module, or the modules that share a
    session's cluster."""
    for fixture, group in SHARED_SESSION_FIXTURES.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    return item.nodeid.partition("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before xdist reads them (`--dist loadgroup`): each test's group."""
    for item in items:
        item.stash[GROUP] = group_of(item)
        item.add_marker(pytest.mark.xdist_group(item.stash[GROUP]))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The groups that hold a heavy suite first (`--no-loadscope-reorder`): the minutes of a
    real engine are not the last thing a worker does while the other waits. After
    pytest-django's own order (database tests first), which is kept within each group, and
    before xdist's worker reports the collection."""
    items = session.items
    heavy = {item.stash[GROUP] for item in items if item.get_closest_marker("heavy")}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.stash[GROUP], index)
    items.sort(key=lambda item: (item.stash[GROUP] not in heavy, first[item.stash[GROUP]]))
