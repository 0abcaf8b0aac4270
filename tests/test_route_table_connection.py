"""The route table's checks keep one database connection (common/db_thread.py), let go of it
once idle and at the loop's end, and replace one the database dropped rather than keep it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created

from common.db_calls import fresh
from common.db_thread import DatabaseThread
from openai_api.catalog import catalog
from openai_api.models import ApiKey
from tests.conftest import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.postgres]


# Threads that write on their own schedule (usage every MSHIP_USAGE_FLUSH_S, budgets every
# MSHIP_BUDGET_REFRESH_S once one is set), whatever the route table does.
OWN_SCHEDULE = ("modelship-usage", "modelship-budgets")


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The threads that open a database connection while the test runs (the test's own
    thread and those on their own schedule left out)."""
    threads: list[str] = []
    own = threading.current_thread()

    def count(sender: Any, **kwargs: Any) -> None:
        thread = threading.current_thread()
        if thread is not own and thread.name not in OWN_SCHEDULE:
            threads.append(thread.name)

    connection_created.connect(count)
    yield threads
    connection_created.disconnect(count)


def checks(count: int) -> None:
    """Wait until the route table has been checked against the tables `count` times more
    (each check that finds them unchanged marks the table current again)."""
    seen: set[float] = set()

    def checked() -> bool:
        if catalog.snapshot is not None:
            seen.add(catalog.snapshot.loaded_at)
        return len(seen) > count

    wait_until(checked, 30)


def test_it_checks_the_tables_on_one_connection_it_keeps(
    api_key: Callable[..., str], opened: list[str]
) -> None:
    api_key()  # the gateway runs, checking 20 times a second (MSHIP_ROUTE_REFRESH_S 0.05)
    opened.clear()
    checks(20)
    # One at most: the check after the key's load may open it; a connection per check was 20.
    assert len(opened) <= 1, opened


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server that drops connections")
def test_it_opens_another_connection_when_the_database_dropped_the_kept_one(
    gateway_url: str, api_key: Callable[..., str], opened: list[str]
) -> None:
    first = api_key()
    checks(3)
    with connection.cursor() as cursor:  # what a database restart or an idle timeout does
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    second = api_key()  # seen by the gateway: its checks and loads work again
    checks(3)
    assert opened, "no new connection after the old one was dropped"
    for key in (first, second):
        answer = httpx.get(gateway_url + "/v1/models", headers={"authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text


async def test_it_lets_go_of_its_connection_once_idle_and_when_released(
    transactional_db: None,
) -> None:
    kept = DatabaseThread("test-db-thread", idle_s=0.3)

    def read() -> Any:
        ApiKey.objects.exists()
        return connections["default"]  # this thread's: `.connection` is the open one

    wrapper = await kept.run(read)
    assert wrapper.connection is not None
    assert await kept.run(read) is wrapper and wrapper.connection is not None  # kept
    wait_until(lambda: wrapper.connection is None, 5)  # unused for 0.3 s
    assert (await kept.run(read)).connection is not None  # opened again when needed
    kept.release()
    assert wrapper.connection is None


async def test_it_opens_a_new_connection_once_the_kept_one_is_too_old(
    transactional_db: None,
) -> None:
    """A database moved to another address is followed: no connection is kept forever."""
    kept = DatabaseThread("test-db-thread", max_age_s=0.0)  # every read finds it too old

    def read() -> Any:
        ApiKey.objects.exists()
        return connections["default"].connection

    first = await kept.run(read)
    assert await kept.run(read) is not first
    kept.release()


async def test_it_skips_a_read_whose_caller_gave_up(transactional_db: None) -> None:
    kept = DatabaseThread("test-db-thread")
    gate = threading.Event()
    ran: list[int] = []
    busy = asyncio.ensure_future(kept.run(lambda: gate.wait(10)))  # the thread held
    given_up = asyncio.ensure_future(kept.run(lambda: ran.append(1)))
    await asyncio.sleep(0)  # both handed over
    given_up.cancel()  # a client that hung up while its read waited its turn
    gate.set()
    assert await busy is True
    assert await kept.run(lambda: 2) == 2  # the thread went past the given-up read
    assert ran == [] and given_up.cancelled()
    kept.release()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server that drops connections")
def test_it_reads_for_the_controller_on_a_thread_whose_connection_the_server_dropped(
    transactional_db: None,
) -> None:
    """Other work may leave a pool thread's connection open; the server drops it (a restart,
    pg_terminate_backend); the on-demand controller's next read on that thread checks it
    first and opens another, instead of answering 503 ondemand_unavailable."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(ApiKey.objects.exists).result()  # left open on the thread
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        assert pool.submit(fresh, ApiKey.objects.count).result() == ApiKey.objects.count()
    finally:
        pool.submit(connections.close_all).result()
        pool.shutdown()
