"""A plain HTTP server on this machine for a test's handler (a stand-in for somewhere a
request must never reach, or an image host it may), and an aiohttp application served the
same way (an engine a test writes)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator


@contextlib.contextmanager
def local_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on 127.0.0.1 (a free port) for the block: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.asynccontextmanager
async def local_app(app: web.Application) -> AsyncIterator[int]:
    """Serve `app` on 127.0.0.1 (a free port) for the block: its port."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
