"""A saved slot cache given back to its conversation (deployments/kv_store.py keeps them):
before a request is sent to a slot that holds less of its prompt than a cache saved at the
engine's last stop, that cache is restored into the slot (`POST /slots/{id}?action=restore`).

The folder's index is read again only where it changed (its time: one stat a request of a
route that keeps caches); reading it, taking an entry and letting its file go run off the
event loop. A file the engine refuses (corrupt, truncated, another model's) is deleted and
the request is served as it would have been: cold.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Final

import aiohttp

from common import metrics
from common.chains import shared_run
from deployments import kv_store
from openai_api.forwarder import forwarder

if TYPE_CHECKING:
    from openai_api.routing.hints import Hint

log = logging.getLogger(__name__)
RESTORE_TIMEOUT: Final = aiohttp.ClientTimeout(total=30)
# Per deployment: its index as last read, by the index file's time.
_read: dict[str, tuple[int, list[kv_store.Entry]]] = {}


async def saved(name: str) -> list[kv_store.Entry]:
    """The deployment's saved caches: read again (off the loop) only when its index changed,
    so a route whose saved caches no request continues costs a stat a request."""
    try:
        stamp = os.stat(kv_store.folder(name) / kv_store.INDEX).st_mtime_ns
    except OSError:
        _read.pop(name, None)
        return []
    known = _read.get(name)
    if known is None or known[0] != stamp:
        index = await asyncio.to_thread(kv_store.read_index, kv_store.folder(name))
        known = _read[name] = (stamp, index.entries)
    return known[1]


async def restore(name: str, url: str, slot: int, hint: Hint, held: tuple[int, bool]) -> int | None:
    """How many of the request's blocks the slot holds once the best saved cache is restored
    into it, where one holds more of it than the slot does (`held`: its run of blocks, and
    whether it holds an earlier request of the conversation); None where none was."""
    if not hint.blocks:
        return None
    blocks, marks = list(hint.blocks), set(hint.marks)
    if not any(
        (found := kv_store.worth_restoring(entry, blocks, marks)) is not None and found > held
        for entry in await saved(name)
    ):
        return None
    entry, _ = await asyncio.to_thread(kv_store.take, name, blocks, list(hint.marks), held)
    if entry is None:
        return None
    session = forwarder.session(url)
    try:
        async with session.post(
            f"{url}/slots/{slot}?action=restore",
            json={"filename": entry.file},
            timeout=RESTORE_TIMEOUT,
        ) as answer:
            ok, said = answer.status == 200, (await answer.text())[:300]
    except (aiohttp.ClientError, TimeoutError) as exc:
        ok, said = False, f"{type(exc).__name__}: {exc}"
    await asyncio.to_thread(kv_store.let_go, name, entry)
    metrics.kv_restores.labels(name, "restored" if ok else "discarded").inc()
    if not ok:
        log.warning("%s: a saved slot cache was discarded (served cold): %s", name, said)
        return None
    return shared_run(entry.blocks, blocks)
