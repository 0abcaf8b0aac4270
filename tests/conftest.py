"""Shared fixtures: real engine processes, cleaned up after every test."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis
import redis.asyncio
from channels.layers import ChannelLayerManager
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django_q.brokers import get_broker
from django_q.signing import SignedPackage

from deployments import deployer, engine_envs, engine_secrets
from deployments.footprint import tree
from deployments.models import Deployment
from deployments.runtimes import EngineUnreachable, get_runtime
from deployments.runtimes.process import proc_stat
from openai_api.access import writer
from openai_api.dispatch import dispatcher
from openai_api.usage.budgets import budgets
from openai_api.usage.counters import sync
from openai_api.usage.ledger import ledger

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator

REPO = Path(__file__).resolve().parent.parent
if os.environ.get("PYTEST_XDIST_WORKER") and "tests.parallel_env" not in sys.modules:
    raise pytest.UsageError(
        "run the suite on several workers with -p tests.parallel_env (each its own site): make test"
    )
# Fixtures every test file may use: the in-process gateway and a key, the Docker Engine, a
# served Modelship, a local Ray cluster, a site of several gateway processes.
pytest_plugins = [
    "tests.gateway_support",
    "tests.docker_support",
    "tests.registry_support",
    "tests.live_support",
    "tests.store_support",
    "tests.ray_support",
    "tests.site_support",
    "tests.time_budget",
]


# Where a test runs. `make test` runs the whole suite on SQLite, then again on PostgreSQL +
# Redis only what differs there (MSHIP_TEST_BACKENDS_ONLY=1): the tests marked as exercising
# the database's own behaviour (postgres), a Redis path (redis), or as their API family's
# sample (sample). A test that uses a Redis path without saying so fails on SQLite, and one
# skipped there for PostgreSQL's or Redis's sake without saying so fails there too: neither
# may run on SQLite alone (backend_guard, pytest_runtest_makereport).
EACH_MARKERS = ("postgres", "redis", "sample")
REDIS_HINT = "mark it @pytest.mark.redis (it runs again on PostgreSQL + Redis)"
# The API families whose sample runs on each back-end: make test-postgres refuses to start
# without one of each (a family left with none would be tested on SQLite alone).
SAMPLED_FAMILIES = (
    "chat",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "audio",
    "images",
    "models",
    "ondemand",
    "rest",
    "admin",
)

# A test touches the database when one of these is among its fixtures, or a fixture of ours
# that unblocks the database (a server started for the session), or it has the django_db
# marker. A test that reaches it without saying so fails (backend_guard): it would run outside
# the transaction or flush that keeps tests apart.
BACKEND_FIXTURES = frozenset({"db", "transactional_db", "live_server"})
BACKEND_ONLY_HINT = "give it the db fixture"


def touches_backends(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") or runs_on_each(item):
        return True
    if set(getattr(item, "fixturenames", ())) & BACKEND_FIXTURES:
        return True
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        for definition in definitions:
            own = not getattr(definition.func, "__module__", "").startswith("pytest_django")
            if own and "django_db_blocker" in definition.argnames:
                return True
    return False


def runs_on_each(item: pytest.Item) -> bool:
    """Whether the test runs on PostgreSQL + Redis too, not on SQLite alone."""
    return any(item.get_closest_marker(name) for name in EACH_MARKERS)


def sampled_families(items: list[pytest.Item]) -> set[str]:
    return {
        str(family)
        for item in items
        for mark in item.iter_markers("sample")
        for family in mark.args
    }


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The second back-end's run (MSHIP_TEST_BACKENDS_ONLY=1) leaves out every test that is
    not marked to run on each: it ran on SQLite. The heavy real-engine suites run once per
    `make test`: that run (MSHIP_TEST_HEAVY=0) skips them, as they do not depend on the
    database."""
    unknown = sampled_families(items) - set(SAMPLED_FAMILIES)
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.sample of no family: {sorted(unknown)}")
    if os.environ.get("MSHIP_TEST_BACKENDS_ONLY") == "1":
        once = [item for item in items if not runs_on_each(item)]
        if once:
            config.hook.pytest_deselected(items=once)
            items[:] = [item for item in items if runs_on_each(item)]
        missing = set(SAMPLED_FAMILIES) - sampled_families(items)
        whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
        if (
            missing
            and whole
            and not config.getoption("keyword")
            and not config.getoption("markexpr")
        ):
            raise pytest.UsageError(
                f"no test of the API families {sorted(missing)} runs on this back-end: mark"
                " one of each @pytest.mark.sample(family)"
            )
    if os.environ.get("MSHIP_TEST_HEAVY", "1") != "0":
        return
    skip = pytest.mark.skip(reason="a heavy engine suite: run once, on SQLite (make test-sqlite)")
    for item in items:
        if item.get_closest_marker("heavy"):
            item.add_marker(skip)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str:
    each = sum(runs_on_each(item) for item in items)
    if os.environ.get("MSHIP_TEST_BACKENDS_ONLY") == "1":
        return f"{each} tests run again on this back-end (the others ran once, on SQLite)"
    return f"{each} tests run on each back-end, {len(items) - each} on this one alone"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test skipped here for PostgreSQL's or Redis's sake must run on them: it fails
    unless marked to (it would otherwise run nowhere)."""
    report = yield
    if report.skipped and not runs_on_each(item):
        reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else "")
        if re.search(r"postgres|redis", reason, re.IGNORECASE):
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} is skipped here ({reason}) and does not run on PostgreSQL +"
                " Redis: mark it @pytest.mark.postgres or @pytest.mark.redis"
            )
    return report


class BackendUsed(AssertionError):
    """A test that is not marked as touching the back-ends reached one."""


@pytest.fixture(autouse=True)
def backend_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test fails where it reaches what it did not say it uses: the database, the channel
    layer or a Modelship subprocess sharing the database without the db fixture (it would
    run outside the flush that keeps tests apart), and Redis (a client, or a subprocess on
    it) without the redis marker (it would run on SQLite alone). Only its own thread is
    watched (a server another test started may serve in the background)."""
    if runs_on_each(request.node):
        return
    watched = threading.get_ident()

    def refuse(what: str, hint: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == watched:
                raise BackendUsed(f"{request.node.nodeid} uses {what}: {hint}")
            return original(*args, **kwargs)

        return guarded

    for client in (redis.Redis, redis.asyncio.Redis):
        monkeypatch.setattr(client, "__init__", refuse("Redis", REDIS_HINT, client.__init__))
    # Modelship subprocesses: env_for_subprocess looks here (tests import it by name).
    GUARDED[watched] = (request.node.nodeid, touches_backends(request.node))
    request.addfinalizer(lambda: GUARDED.pop(watched, None))
    if touches_backends(request.node):
        # The product's own use of the channel layer (in memory on SQLite) is no Redis
        # path of the test's: only a test that reaches it with no back-end at all is told.
        return
    layers = ChannelLayerManager.__getitem__
    hint = f"{BACKEND_ONLY_HINT}, or {REDIS_HINT}"
    monkeypatch.setattr(
        ChannelLayerManager, "__getitem__", refuse("the channel layer", hint, layers)
    )
    # pytest-django refuses the ORM only until a session's server unblocks it: this thread's
    # connection refuses it for the test, whatever was unblocked before.
    refused = refuse("the database", BACKEND_ONLY_HINT, lambda execute, *args: execute(*args))
    connection.execute_wrappers.append(refused)
    request.addfinalizer(lambda: connection.execute_wrappers.remove(refused))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test that points this process's gateway at Redis (`site.REDIS_URL = ...`) uses a
    Redis path, as one that makes a client does."""
    phase_redis = os.environ.get("REDIS_URL", "")
    result = yield
    from django.conf import settings  # noqa: PLC0415 - read at the test's end

    if not runs_on_each(item) and getattr(settings, "REDIS_URL", "") not in ("", phase_redis):
        raise BackendUsed(f"{item.nodeid} sets REDIS_URL: {REDIS_HINT}")
    return result


# The thread of a running test that is not marked to run on each back-end, to its id and
# whether it touches the database.
GUARDED: dict[int, tuple[str, bool]] = {}


def time_scale() -> float:
    """MSHIP_TEST_TIME_SCALE (at least 1): how much slower than alone this machine runs the
    suite (busy with another clone's run, an engine install)."""
    raw = os.environ.get("MSHIP_TEST_TIME_SCALE") or "1"
    try:
        scale = float(raw)
    except ValueError:
        raise pytest.UsageError(f"MSHIP_TEST_TIME_SCALE={raw!r} is not a number") from None
    if not scale >= 1:  # NaN too
        raise pytest.UsageError(f"MSHIP_TEST_TIME_SCALE={raw!r} must be at least 1")
    return scale


TIME_SCALE = time_scale()


def scaled(seconds: float) -> float:
    """A deadline a test waits on, held on a busy machine: every start timeout and wait."""
    return seconds * TIME_SCALE


def host_lock(name: str) -> contextlib.AbstractContextManager[None]:
    """Held by one test on this host at a time, across runs side by side (what is the
    host's: a network bridge, an address range)."""
    return engine_envs.locked(Path(tempfile.gettempdir()) / f"modelship-test-{name}")


@pytest.fixture(scope="session", autouse=True)
def quiet_access_log() -> Iterator[None]:
    """The access lines of the gateway served in this process are dropped (a real server's go
    to its standard output; tests that read them keep them: test_metrics' access_lines)."""

    class Discard(io.StringIO):
        def write(self, text: str) -> int:
            return len(text)

    writer.stream = Discard()
    yield
    writer.stream = None


@pytest.fixture(scope="session", autouse=True)
def usage_written_when_asked() -> Iterator[None]:
    """The usage ledger and the budget counters of this process write and read only when a
    test asks (`ledger.flush()`, `sync.sync()`), never from their threads in the middle of
    another test; what is left is dropped at the end, not written to a database gone by then."""
    ledger.stop.set()
    sync.stop.set()
    yield
    ledger.rows.clear()


@pytest.fixture(autouse=True)
def fresh_usage() -> None:
    """Each test counts its own requests: what earlier ones used is not flushed into its."""
    with ledger.lock:
        ledger.rows.clear()
    budgets.forget()
    dispatcher.router.affinity.clear()  # and its conversations land by their own keys


# What the flush between transactional tests keeps: what migrate made once (Django's post_migrate
# would otherwise make them again after every test) and no test changes.
KEPT_TABLES = frozenset({ContentType._meta.db_table, Permission._meta.db_table})


@pytest.fixture(scope="session", autouse=True)
def quick_flush() -> Iterator[None]:
    """Between transactional tests the tables are emptied as quickly as the back-end can:
    the content types and permissions migrate made are kept (so post_migrate need not make
    them again, about 0.06 s a test on PostgreSQL), and PostgreSQL's tables are emptied with
    DELETE, not Django's TRUNCATE, which makes new files for each table (about 0.2 s a
    test) while the tables a test leaves hold a few rows. Django's foreign keys are
    INITIALLY DEFERRED: checked at the flush's commit, when every table is empty."""
    from django.core.management.commands import flush  # noqa: PLC0415

    def sql_flush(
        style: Any, conn: Any, reset_sequences: bool = True, allow_cascade: bool = False
    ) -> list[str]:
        names = conn.introspection.django_table_names(only_existing=True, include_views=False)
        tables = [name for name in names if name not in KEPT_TABLES]
        if conn.vendor != "postgresql" or reset_sequences or not tables:
            ops: list[str] = conn.ops.sql_flush(
                style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
            return ops
        quoted = [conn.ops.quote_name(table) for table in tables]
        # Locked together first, as TRUNCATE locks them: a thread a test left writing waits
        # for the flush instead of adding a row between two tables' deletes.
        lock = f"LOCK TABLE {', '.join(quoted)} IN EXCLUSIVE MODE;"
        return [lock, *(f"DELETE FROM {table};" for table in quoted)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flush, "sql_flush", sql_flush)
        patch.setattr(flush, "emit_post_migrate_signal", lambda *args, **kwargs: None)
        yield


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, whose PostgreSQL sessions still open at the end (the
    in-process gateway's worker threads keep theirs) are ended so that it can be dropped."""
    yield

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def site(settings: Any, tmp_path: Path) -> Any:
    """Each test gets its own run and log folders and a known memory budget."""
    settings.MSHIP_RUN_DIR = tmp_path / "run"
    settings.MSHIP_ENGINE_LOG_DIR = tmp_path / "logs"
    settings.MSHIP_MEMORY_CAPACITY_GIB = 8.0
    settings.MSHIP_GPU_MEMORY_GIB = 8.0
    settings.MSHIP_STOP_GRACE_S = 2.0
    # The product's own start timeout, scaled: a start that fails says so when its engine
    # exits; only one that hangs waits this long.
    settings.MSHIP_START_TIMEOUT_S = scaled(settings.MSHIP_START_TIMEOUT_S)
    # Engine environments come from the machine-wide cache (MSHIP_ENGINE_ENVS_DIR, else the
    # user's): made once, shared by every test, run and clone, as `make run`'s.
    return settings


@pytest.fixture
def engines(transactional_db: None) -> Iterator[None]:
    """For tests that start engines: every engine still running at the end is stopped."""
    yield
    for deployment in Deployment.objects.all():
        runtime = get_runtime(deployment.runtime)
        for handle in (deployment.runtime_handle or {}).get("replicas", []):
            with contextlib.suppress(EngineUnreachable):  # a test's own daemon, gone first
                runtime.stop(handle, 0.5)


@pytest.fixture
def make_deployment(transactional_db: None) -> Callable[..., Deployment]:
    def make(name: str = "sim", **fields: Any) -> Deployment:
        values: dict[str, Any] = {
            "name": name,
            "model": "simulated",
            "loader": "simulated",
            "runtime": "process",
            "memory_gib": 1.0,
        }
        values.update(fields)
        return Deployment.objects.create(**values)

    return make


class AsGateway(httpx.Auth):
    """What a test that calls an engine straight sends it, as the gateway does: the secret of
    the replica at that address (deployments/engine_secrets.py), read from the rows as it
    asks; nothing to an address no row has."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        yield from self.now().auth_flow(request)

    @staticmethod
    def now() -> engine_secrets.EngineAuth:
        """The secrets as the rows hold them now: for a request on another thread, which
        should not open a database connection of its own."""
        rows = Deployment.objects.values_list("runtime_handle", flat=True)
        return engine_secrets.EngineAuth(h for row in rows for h in (row or {}).get("replicas", []))


as_gateway = AsGateway()


def chat(
    url: str, text: str = "hello", *, auth: httpx.Auth = as_gateway, **body: Any
) -> dict[str, Any]:
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "any", "messages": [{"role": "user", "content": text}], **body},
        timeout=10,
        auth=auth,
    )
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result


def answers(url: str) -> bool:
    """Whether a server answers at `url` (with anything short of a 5xx)."""
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


def reply_of(url: str, auth: httpx.Auth = as_gateway) -> str:
    return str(chat(url, auth=auth)["choices"][0]["message"]["content"])


def sim(**options: Any) -> dict[str, Any]:
    """A simulated_config block (kept as a dict; JSON-clean)."""
    clean: dict[str, Any] = json.loads(json.dumps(options))
    return clean


def pid_alive(pid: int) -> bool:
    # proc_stat: a process that ends between opening its stat and reading it is gone, not an error
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in "ZX"


def resident_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def tree_resident_bytes(pid: int) -> int:
    """A process's resident memory with its children's, and theirs (an engine that forks)."""
    return sum(resident_bytes(process) for process in tree(pid))


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll what offers no event to wait on (a process exit, a row another process writes);
    the timeout is scaled (MSHIP_TEST_TIME_SCALE)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


class HeldSleep:
    """Engines' /sleep, held (vLLM's takes up to a minute): `began` is set once a sleep is
    asked of an engine, which gets it when the test sets `release`."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.release = threading.Event()


@pytest.fixture
def held_sleep(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldSleep]:
    held = HeldSleep()
    post_each = deployer._post_each

    def slow_sleep(deployment: Deployment, path: str) -> None:
        if path.startswith("/sleep"):
            held.began.set()
            held.release.wait(scaled(60))
        post_each(deployment, path)

    monkeypatch.setattr(deployer, "_post_each", slow_sleep)
    yield held
    held.release.set()  # a test that failed half-way leaves no sleep waiting


def in_thread(target: Callable[..., Any], *args: Any) -> threading.Thread:
    """Start target in a thread that closes its own database connection when done, so the
    test database can be dropped at the end."""

    def run() -> None:
        try:
            target(*args)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def env_for_subprocess(**extra: str) -> dict[str, str]:
    """The environment a Modelship subprocess needs to share this test's database."""
    guarded = GUARDED.get(threading.get_ident())
    if guarded and not guarded[1]:
        raise BackendUsed(f"{guarded[0]} starts a subprocess on the database: {BACKEND_ONLY_HINT}")
    if guarded and extra.get("REDIS_URL"):
        raise BackendUsed(f"{guarded[0]} starts a subprocess on Redis: {REDIS_HINT}")
    env = dict(os.environ)
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    else:
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    env["MSHIP_ENGINE_ENVS_DIR"] = str(engine_envs.root())  # made once, shared
    # Its own metrics folder: `serve` empties its folder at start, and this process's is in use.
    env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="modelship-metrics-")
    env.update(extra)
    return env


def reap(site: Any) -> str:
    """The reaper, once, as its management command runs it: what it put away."""
    done = subprocess.run(
        [sys.executable, "manage.py", "reap_ondemand"],
        cwd=REPO,
        env=env_for_subprocess(MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR)),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip()


def take_queue() -> list[dict[str, Any]]:
    """The tasks queued for the clusters (the main one, and the pulls' own), taken off their
    queues (not run)."""
    tasks = []
    for broker in (get_broker(), get_broker(django_settings.MSHIP_PULLS_CLUSTER)):
        while broker.queue_size():
            for ack, packed in broker.dequeue() or []:
                broker.acknowledge(ack)
                tasks.append(SignedPackage.loads(packed))
    return tasks


def run_queue() -> list[tuple[str, tuple[Any, ...]]]:
    """Run what the operations queued, here, as the django-q cluster would (and what those
    tasks queue in turn); return it."""
    ran = []
    while tasks := take_queue():
        for task in tasks:
            ran.append((task["func"].__name__, task["args"]))
            task["func"](*task["args"], **task["kwargs"])
    return ran
