"""A shared prefix copied between the slots of one llama.cpp replica: a request pinned to a
free slot that holds less of its prompt than another free slot of its replica has that
slot's cache copied into its own before it is sent (`POST /slots/{donor}?action=save`, then
`/slots/{slot}?action=restore`, through a file in the deployment's folder under
VAR_DIR/kv, deleted once read).

llama.cpp keeps each slot's KV cache apart: without the copy, every conversation's first
turn under a tenant's long system prompt computes that prompt again in a slot of its own.
The copy costs a write and a read of the donor's cache (0.1 s for 5,800 tokens of SmolLM2,
bench/kv_resume.py) where the prefill costs seconds on a CPU. The engine computes what
follows the prompts' common prefix, so a copy holding more than the request shares is
harmless. A copy that fails is a prompt computed as it would have been; an engine started
without a folder to save in (before the route copied) is not asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Final

import aiohttp

from common import metrics
from deployments import kv_store
from openai_api.forwarder import forwarder

log = logging.getLogger(__name__)
# Each of the save and the restore: a free slot's takes a fraction of a second; one the
# engine put behind a request's answer is not waited for.
COPY_TIMEOUT: Final = aiohttp.ClientTimeout(total=5)
UNSUPPORTED: Final = 501  # llama.cpp's answer to a slot action where it has no folder
MAX_CANNOT: Final = 1024
# Engines that said they cannot save a slot: asked no more (a new engine has a new address).
cannot: set[str] = set()


async def copy(deployment: str, url: str, donor: int, slot: int) -> bool:
    """The donor slot's cache copied into `slot` of the replica at `url`; whether it was."""
    if url in cannot:
        return False
    name = f"{secrets.token_hex(8)}{kv_store.COPY_SUFFIX}"
    session = forwarder.session(url)
    said = "cancelled"
    try:
        said = await copied(session, url, name, donor, slot)
    except (aiohttp.ClientError, TimeoutError) as exc:
        said = f"{type(exc).__name__}: {exc}"
    finally:
        await asyncio.to_thread(let_go, deployment, name)
        if said:  # an engine that saves once its slot is free writes the file after this
            loop = asyncio.get_running_loop()
            loop.call_later(
                kv_store.COPY_LEFT_S, loop.run_in_executor, None, let_go, deployment, name
            )
    metrics.slot_copies.labels(deployment, "failed" if said else "copied").inc()
    if said:
        log.warning(
            "%s: slot %d not copied into slot %d of %s: %s", deployment, donor, slot, url, said
        )
    return not said


async def copied(session: aiohttp.ClientSession, url: str, name: str, donor: int, slot: int) -> str:
    """The save and the restore through the file `name`: "" where both were done, else what
    the engine said."""
    for action, number in (("save", donor), ("restore", slot)):
        async with session.post(
            f"{url}/slots/{number}?action={action}", json={"filename": name}, timeout=COPY_TIMEOUT
        ) as answer:
            if answer.status == UNSUPPORTED and len(cannot) < MAX_CANNOT:
                cannot.add(url)
            if answer.status != 200:
                text = (await answer.read())[:300].decode(errors="replace")
                return f"{action}: {answer.status} {text}"
    return ""


def let_go(deployment: str, name: str) -> None:
    with contextlib.suppress(OSError):
        (kv_store.folder(deployment) / name).unlink()
