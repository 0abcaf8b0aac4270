"""Database work outside Django's request cycle: the one way to run it.

Django checks and closes a thread's connection at the start and end of each request
(`close_old_connections`). Work done elsewhere (a pool thread of the event loop, the usage
ledger's thread, the scheduler's owner) gets no such care: a connection the server dropped (a
restart, a failover, `pg_terminate_backend`, an idle timeout) stays in the thread and fails
every later use with `OperationalError: terminating connection ...` or `InterfaceError:
connection already closed`, until the process restarts. Every such unit of work goes through
`fresh()` (blocking code) or `off_loop()` (from an event loop): the thread's connection, where
one is left, is checked before the work (and replaced when the server dropped it) and closed
after it, so no connection outlives its unit. Threads that keep a connection on purpose
(common/db_thread.py) replace it after an error and read once more.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def checked() -> None:
    """The thread's connection closed where the server dropped it (the next query opens
    another); nothing is done where none is open."""
    if connection.connection is not None and not connection.is_usable():
        connection.close()


def lost() -> bool:
    """After a failed query: whether the connection is gone (the query may be run again on a
    new one), as opposed to a query the database refused."""
    if connection.connection is None:
        return True
    return not connection.is_usable()


def fresh(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a checked connection, closed after."""
    checked()
    try:
        return fn(*args, **kwargs)
    finally:
        connection.close()


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fresh(fn, ...)` on a pool thread, awaited from the event loop."""
    return await sync_to_async(
        functools.partial(fresh, fn, *args, **kwargs), thread_sensitive=False
    )()
