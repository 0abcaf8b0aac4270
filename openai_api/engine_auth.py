"""The gateway's side of each engine's own secret (deployments/engine_secrets.py): every
request of an engine's pooled session (forwarded, or the gateway's own: adapter loads, token
counts, the engine's Responses) carries that engine's secret as its Authorization, and
nothing else there, so a caller's key never reaches an engine (the forwarder drops it too).

The secret comes from the route table (openai_api/catalog.py), read with the engine's URL in
the same row. An engine the table has not seen yet (the site's scheduler granted a slot on a
start that ended since the last reload) makes the table read again; one that left it
(replaced, draining, while a router still holds the old table) keeps the secret its session
last sent. Not handled: a new engine on a recycled address (a container's IP, a freed port)
while this process still holds a table listing the old one at it; it answers 401 until the
next reload (MSHIP_ROUTE_REFRESH_S).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from openai_api.catalog import catalog

if TYPE_CHECKING:
    from aiohttp import ClientRequest, ClientResponse
    from aiohttp.client_middlewares import ClientHandlerType, ClientMiddlewareType


def engine_auth(base_url: str) -> ClientMiddlewareType:
    """The aiohttp client middleware of the session of the engine at `base_url`."""
    used = ""

    async def authorize(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        nonlocal used
        snapshot = catalog.snapshot
        secret = snapshot.engine_secrets.get(base_url) if snapshot is not None else ""
        if secret is None:
            secret = used or await catalog.engine_secret(base_url)
        used = secret
        if secret:
            request.headers["Authorization"] = f"Bearer {secret}"
        else:
            request.headers.popall("Authorization", None)
        return await handler(request)

    return authorize
