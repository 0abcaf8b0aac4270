"""Shared fixtures: real engine processes, cleaned up after every test."""

from __future__ import annotations

import contextlib
import io
import json
import os
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
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django_q.brokers import get_broker
from django_q.signing import SignedPackage

from deployments import deployer, engine_envs, engine_secrets
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
]


# A test touches the back-ends (the database, django-q's broker, the channel layer, Redis) when
# one of these is among its fixtures, or a fixture of ours that unblocks the database (a
# server started for the session), or it has the django_db or backend marker: only such tests
# run again on PostgreSQL + Redis (MSHIP_TEST_BACKENDS_ONLY=1). A test that reaches one
# without saying so fails (backend_guard).
BACKEND_FIXTURES = frozenset({"db", "transactional_db", "live_server"})
BACKEND_ONLY_HINT = "mark it @pytest.mark.backend or give it the db fixture"


def touches_backends(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") or item.get_closest_marker("backend"):
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy real-engine suites run once per `make test`: the second database's run
    (MSHIP_TEST_HEAVY=0) skips them, as they do not depend on the database. That run
    (MSHIP_TEST_BACKENDS_ONLY=1) also leaves out every test that touches no back-end: it
    ran on the first."""
    if os.environ.get("MSHIP_TEST_BACKENDS_ONLY") == "1":
        once = [item for item in items if not touches_backends(item)]
        if once:
            config.hook.pytest_deselected(items=once)
            items[:] = [item for item in items if touches_backends(item)]
    if os.environ.get("MSHIP_TEST_HEAVY", "1") != "0":
        return
    skip = pytest.mark.skip(reason="a heavy engine suite: run once, on SQLite (make test-sqlite)")
    for item in items:
        if item.get_closest_marker("heavy"):
            item.add_marker(skip)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str:
    both = sum(touches_backends(item) for item in items)
    if os.environ.get("MSHIP_TEST_BACKENDS_ONLY") == "1":
        return f"{both} tests touch the back-ends: run again here (the others ran once)"
    return f"{both} tests touch the back-ends (run on each), {len(items) - both} do not"


class BackendUsed(AssertionError):
    """A test that is not marked as touching the back-ends reached one."""


@pytest.fixture(autouse=True)
def backend_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that touches no back-end by its fixtures and markers fails where it reaches
    the database, the channel layer, a Redis client or a Modelship subprocess sharing the
    database: it would otherwise run on one back-end only. Only its own thread is watched
    (a server another test started may serve in the background)."""
    if touches_backends(request.node):
        return
    watched = threading.get_ident()

    def refuse(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == watched:
                raise BackendUsed(f"{request.node.nodeid} uses {what}: {BACKEND_ONLY_HINT}")
            return original(*args, **kwargs)

        return guarded

    layers = ChannelLayerManager.__getitem__
    monkeypatch.setattr(ChannelLayerManager, "__getitem__", refuse("the channel layer", layers))
    for client in (redis.Redis, redis.asyncio.Redis):
        monkeypatch.setattr(client, "__init__", refuse("Redis", client.__init__))
    # Modelship subprocesses: env_for_subprocess looks here (tests import it by name).
    GUARDED[watched] = request.node.nodeid
    request.addfinalizer(lambda: GUARDED.pop(watched, None))
    # pytest-django refuses the ORM only until a session's server unblocks it: this thread's
    # connection refuses it for the test, whatever was unblocked before.
    refused = refuse("the database", lambda execute, *args: execute(*args))
    connection.execute_wrappers.append(refused)
    request.addfinalizer(lambda: connection.execute_wrappers.remove(refused))


# The thread of the running test that touches no back-end, to its id.
GUARDED: dict[int, str] = {}


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
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += resident_bytes(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            children = (task / "children").read_text().split()
            todo += [int(child) for child in children]
    return total


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
    if guarded:
        raise BackendUsed(f"{guarded} starts a subprocess on the database: {BACKEND_ONLY_HINT}")
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
    """The tasks queued for the cluster, taken off the queue (not run)."""
    broker = get_broker()
    tasks = []
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
