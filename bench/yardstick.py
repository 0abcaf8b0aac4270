"""The yardstick: the least a pass-through proxy can do, as raw ASGI with one pooled aiohttp
session. Run under the same ASGI server as the gateway, it shows what the gateway itself
costs beyond forwarding bytes.

    YARDSTICK_UPSTREAM=http://127.0.0.1:8001 uvicorn bench.yardstick:app --port 8002
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

UPSTREAM = os.environ.get("YARDSTICK_UPSTREAM", "http://127.0.0.1:8001")
session: aiohttp.ClientSession | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global session
    if scope["type"] != "http":
        return
    if session is None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {"content-type": "application/json"}
    async with session.request(
        scope["method"], UPSTREAM + scope["path"], data=body, headers=headers
    ) as response:
        out = [
            (k, v)
            for k, v in response.raw_headers
            if k.lower() not in (b"transfer-encoding", b"connection")
        ]
        await send({"type": "http.response.start", "status": response.status, "headers": out})
        async for chunk in response.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
