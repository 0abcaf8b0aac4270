"""Each engine's own secret: made for every replica as it starts, given to its engine in its
environment (the loader names the variable: vLLM's VLLM_API_KEY, llama.cpp's
LLAMA_API_KEY, MSHIP_ENGINE_SECRET for the engines Modelship ships), kept in the
replica's handle on the deployment row, and sent by Modelship, and only Modelship, as
`Authorization: Bearer` with every request it makes to that engine.

Why: an engine answers whoever reaches its port (vLLM's adapter loading, llama.cpp's slots
and metrics), and only a container engine sits on a network of its own; a process or Ray
engine listens where other users of the host, or of the Ray cluster, reach it. The
environment, not the command line: anyone on the host reads a process's argv (`ps`), its
environment only its owner.

A secret never leaves the handle but as that header: the admin shows a handle's allowed keys
only, /api shows no handle, and nothing logs one.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable

    from deployments.models import Deployment
    from deployments.runtimes import Handle

# The variable the engines Modelship ships read theirs from (deployments/engines/common.py).
SHIPPED_ENV = "MSHIP_ENGINE_SECRET"
# Where a handle keeps it.
HANDLE_KEY = "secret"


def new() -> str:
    """A fresh secret for one replica's start (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def origin(url: str) -> str:
    """An engine URL's scheme, host and port: what names the engine in any URL under it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def by_url(handles: Iterable[Handle]) -> dict[str, str]:
    """Each replica's secret by its engine URL ("" for an engine started without one: by an
    older Modelship, or adopted so)."""
    return {
        str(h["url"]): str(h.get(HANDLE_KEY) or "")
        for h in handles
        if isinstance(h.get("url"), str)
    }


def bearer(secret: str) -> str:
    return f"Bearer {secret}"


class EngineAuth(httpx.Auth):
    """httpx's authentication for a deployment's engines: each request to one of them gets
    that engine's secret, replacing any Authorization it had; a request elsewhere, none."""

    def __init__(self, handles: Iterable[Handle]) -> None:
        self.secrets = {origin(url): secret for url, secret in by_url(handles).items() if secret}

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        secret = self.secrets.get(origin(str(request.url)))
        if secret:
            request.headers["authorization"] = bearer(secret)
        else:
            request.headers.pop("authorization", None)
        yield request


def auth(deployment: Deployment) -> EngineAuth:
    """The authentication for every engine of a deployment, as its row has them now."""
    return EngineAuth((deployment.runtime_handle or {}).get("replicas", []))
