"""Many streams to one engine at once: each is forwarded as it arrives, none waits for
another's connection to the engine (the forwarder's pool per engine was once 256)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
STREAMS = 300


async def open_all(url: str, key: str) -> list[tuple[str, int]]:
    """Open STREAMS streams at once; the order in which their first events and their ends
    arrived."""
    order: list[tuple[str, int]] = []
    body = {"model": "wide", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    connector = aiohttp.TCPConnector(limit=0)
    headers = {"authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as s:

        async def one(i: int) -> None:
            async with s.post(url, json=body) as answer:
                assert answer.status == 200, await answer.text()
                first = True
                async for line in answer.content:
                    if line.startswith(b"data: {") and first:
                        order.append(("first", i))
                        first = False
                    elif line.startswith(b"data: [DONE]"):
                        order.append(("done", i))

        await asyncio.gather(*(one(i) for i in range(STREAMS)))
    return order


def test_it_holds_hundreds_of_streams_to_one_engine_open_together(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment], site: Any
) -> None:
    # Three words, one every two seconds: each stream stays open six seconds.
    serving("wide", config={"reply": "one two three", "tokens_per_second": 0.5})
    order = asyncio.run(open_all(gateway_url + "/v1/chat/completions", api_key()))
    assert sorted(i for kind, i in order if kind == "done") == list(range(STREAMS))
    first_end = next(n for n, (kind, _) in enumerate(order) if kind == "done")
    # Every stream had begun before any ended: all were open together.
    assert sum(kind == "first" for kind, _ in order[:first_end]) == STREAMS
