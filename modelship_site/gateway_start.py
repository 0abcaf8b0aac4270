"""A gateway process's start (uvicorn's lifespan): its route table is loaded then, and kept
current from then on (openai_api/catalog.py, `warm`); so is the on-demand gateway's peer
policy (ondemand/peers.py), so that no request waits for its first read.

So /metrics has the table's age (modelship_route_table_loaded_timestamp_seconds) before any
request, as a dashboard charts it. Everything but the lifespan goes to the application as it
is: Channels' router knows no lifespan scope.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ondemand.gateway import application as ondemand_gateway
from openai_api.catalog import catalog
from openai_api.usage.ledger import ledger

log = logging.getLogger(__name__)

Asgi = Any


def with_route_table(app: Asgi) -> Asgi:
    async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await load_route_table()
                await ondemand_gateway.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await ondemand_gateway.stop()
                # What the requests used since the last flush is written before the end.
                await asyncio.to_thread(ledger.close)
                await send({"type": "lifespan.shutdown.complete"})
                return

    return application


async def load_route_table() -> None:
    try:
        await catalog.warm()
    except Exception:  # the database is not up yet: the first request loads it, as before
        log.exception("could not load the route table at start")
