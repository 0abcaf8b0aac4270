"""What the starts in this process do before they take the start-up gate (pull an image,
install an engine environment), told to the requests waiting for them.

The deployer says it through a hook, from the thread that does the work; each request that
listens hears it in its own event loop (its queued notice then streams a chunk that says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    Listener = Callable[[str], Any]

_lock = threading.Lock()
_doing: dict[int, str] = {}  # by deployment: what its start does now
_listeners: dict[int, list[tuple[asyncio.AbstractEventLoop, Listener]]] = {}


def tell(deployment_id: int, doing: str) -> None:
    """The hook (any thread): what a start of the deployment is doing now; "" once done."""
    with _lock:
        if not doing:
            _doing.pop(deployment_id, None)
            return
        _doing[deployment_id] = doing
        listening = list(_listeners.get(deployment_id, ()))
    for loop, listener in listening:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody hears it
            loop.call_soon_threadsafe(listener, doing)


def doing(deployment_id: int) -> str:
    """What a start of it does now ("" when none prepares)."""
    with _lock:
        return _doing.get(deployment_id, "")


@contextlib.contextmanager
def listening(deployment_id: int, listener: Listener | None) -> Iterator[None]:
    """While the block runs (a request waits for its slot), `listener` hears in this event
    loop what a start of the deployment is doing: at once when one is under way."""
    if listener is None:
        yield
        return
    entry = (asyncio.get_running_loop(), listener)
    with _lock:
        _listeners.setdefault(deployment_id, []).append(entry)
        doing = _doing.get(deployment_id)
    try:
        if doing:
            listener(doing)
        yield
    finally:
        with _lock:
            rest = [e for e in _listeners.get(deployment_id, []) if e is not entry]
            if rest:
                _listeners[deployment_id] = rest
            else:
                _listeners.pop(deployment_id, None)
