"""From a route to an engine: the seam where the on-demand controller plugs in.

Here a ready deployment gets the replica with the fewest requests outstanding from this
process; anything else is 503 with its state. The on-demand issue replaces `slot` for
on-demand deployments with the controller's acquire and release.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from openai_api.catalog import Route
from openai_api.errors import GatewayError


class Dispatcher:
    def __init__(self) -> None:
        self.outstanding: dict[str, int] = {}

    @asynccontextmanager
    async def slot(self, route: Route) -> AsyncIterator[str]:
        """An engine base URL to send one request to, held until the answer is sent."""
        if route.state != "ready" or not route.urls:
            kind = "on-demand" if route.on_demand else "always-on"
            raise GatewayError(
                503,
                f"The model {route.name!r} is not ready: the {kind} deployment is {route.state}.",
                "model_not_ready",
            )
        url = min(route.urls, key=lambda u: self.outstanding.get(u, 0))
        self.outstanding[url] = self.outstanding.get(url, 0) + 1
        try:
            yield url
        finally:
            self.outstanding[url] -= 1


dispatcher = Dispatcher()
