"""ASGI entry point. Channels routes the public /v1 gateway (and /rerank, /score) to its raw
ASGI handler, ahead of Django's middleware and URL stack; everything else (the admin, /api,
/health) goes to Django's ASGI application. /ondemand/{id}/v1/... is the on-demand gateway
that LiteLLM calls, behind its peer guard. WebSockets: /ws/deployments is the live admin's
(ondemand/live.py: the admin's session, from an allowed host's page only); the rest go to the
Responses API's socket (/v1/responses; any other path is refused at the handshake)."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

from common.traffic import traffic  # noqa: E402
from modelship_site.body_limits import guarded  # noqa: E402
from ondemand.gateway import application as ondemand_gateway  # noqa: E402
from ondemand.live import LiveDeployments  # noqa: E402
from openai_api.gateway import application as openai_gateway  # noqa: E402
from openai_api.websocket import application as responses_socket  # noqa: E402

if settings.REDIS_URL:
    # A site with Redis calls it on its first request: its client loaded now, not then on the
    # event loop (common/redis_errors.py).
    import redis.asyncio  # noqa: F401

# The dashboard's traffic chart: the site's counters, sampled from the server's start.
traffic.start()

# URLRouter routes to ASGI applications; django-stubs type re_path for views only.
routes = [
    re_path(r"^v1(/|$)", openai_gateway),  # type: ignore[arg-type]
    re_path(r"^(rerank|score)$", openai_gateway),  # type: ignore[arg-type]
    re_path(r"^ondemand(/|$)", ondemand_gateway),  # type: ignore[arg-type]
    # Behind the body limits: Django reads a whole body before any view runs.
    re_path(r"", guarded(django_asgi_app)),  # type: ignore[arg-type]
]
live_admin = AllowedHostsOriginValidator(AuthMiddlewareStack(LiveDeployments.as_asgi()))
sockets = [
    re_path(r"^ws/deployments$", live_admin),
    re_path(r"", responses_socket),  # type: ignore[arg-type]
]
routed = ProtocolTypeRouter({"http": URLRouter(routes), "websocket": URLRouter(sockets)})


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The gateway's HTTP paths go straight to it: channels' router matches each request
    against the route list's regular expressions, a measurable share of a short request's
    CPU (bench/README.md). Everything else, and anything unusual, goes through the router."""
    if scope["type"] == "http":
        path = scope["path"]
        if path.startswith("/v1/") or path in GATEWAY_PATHS:
            await openai_gateway(scope, receive, send)
            return
        if path.startswith("/ondemand/"):
            await ondemand_gateway(scope, receive, send)
            return
    await routed(scope, receive, send)


GATEWAY_PATHS = frozenset({"/v1", "/rerank", "/score"})
