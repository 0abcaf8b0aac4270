"""Where the gateway may connect for a request's MCP servers.

A caller names the URL, so the gateway must not become its way into the host: refused by
default are cloud metadata endpoints (always, by name and by address), loopback, link-local
and unspecified addresses, and Modelship's engines (their addresses and their Docker networks:
a vLLM engine in sleep mode serves /sleep and /collective_rpc without auth), unless
MSHIP_MCP_ALLOWED_HOSTS names them. Private networks are fine: a self-hosted MCP server
rarely has a certificate or a public address. MSHIP_MCP_ALLOWED_HOSTS (names, addresses,
networks) and MSHIP_MCP_REQUIRE_HTTPS lock it down further.

The policy is applied twice: to the URL before any engine work (a clear 400), and to the
address a connection is actually made to (`GuardedBackend`), so a name that resolves
differently the second time (DNS rebinding) or a redirect (never followed) gets nowhere.
Addresses are compared as `ipaddress` objects after resolution, so decimal, octal,
IPv4-mapped and IPv4-compatible IPv6 spellings all meet the same rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpcore2
import httpx2
from django.conf import settings

from common.egress import Policy as Policy  # this module's users know it here
from common.egress import host_networks as host_networks
from common.egress import normalise as normalise
from common.egress import own_addresses, resolve
from openai_api.catalog import catalog
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable


def refused(url: str, why: str) -> GatewayError:
    return GatewayError(400, f"The MCP server {url} is not allowed: {why}.", "mcp_egress_refused")


def current_policy() -> Policy:
    allowed = [h.strip().lower().rstrip(".") for h in settings.MSHIP_MCP_ALLOWED_HOSTS]
    snapshot = catalog.snapshot
    engines: list[str] = []
    if snapshot is not None:
        for route in snapshot.models:
            engines += [urlsplit(url).hostname or "" for url in route.urls]
            engines += list(route.networks)
    return Policy(
        allowed_names=frozenset(allowed),
        allowed_networks=host_networks(allowed),
        engine_networks=host_networks(h for h in engines if h),
        require_https=settings.MSHIP_MCP_REQUIRE_HTTPS,
        own_addresses=own_addresses(),
    )


async def check(
    url: str, policy: Policy | None = None, refuse: Callable[[str, str], Exception] = refused
) -> None:
    """400 `mcp_egress_refused` unless the policy allows connecting to `url` (another
    refusal where `refuse` makes one: an input image's URL is no MCP server)."""
    policy = policy or current_policy()
    host, port, why = policy.url_problem(url)
    if why is not None:
        raise refuse(url, why)
    try:
        addresses = await resolve(host, port)
    except OSError as exc:
        raise refuse(url, "its host does not resolve") from exc
    for ip in addresses:
        why = policy.verdict(host, ip)
        if why is not None:
            raise refuse(url, why)


class EgressRefused(OSError):
    """A connection the policy refuses at connect time (DNS rebinding and the like)."""


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """An httpcore2 network backend that resolves a name once, checks every address it got,
    and connects to a checked address, so the address checked is the address used."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's own signature
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore2.AsyncNetworkStream:
        name = host.lower().rstrip(".")
        try:
            addresses = await resolve(name, port)
        except OSError as exc:
            raise EgressRefused("the MCP server's host does not resolve") from exc
        for ip in addresses:
            if self.policy.verdict(name, ip) is not None:
                raise EgressRefused("the MCP server's address is not allowed")
        return await self.inner.connect_tcp(
            str(addresses[0]), port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore2.AsyncNetworkStream:
        raise EgressRefused("unix sockets are not reachable")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def http_client(headers: dict[str, str], policy: Policy | None = None) -> httpx2.AsyncClient:
    """The httpx2 client (the one the mcp SDK speaks) of an MCP connection: it follows no
    redirect (the SDK follows only those within the URL's origin, each connection checked
    again here), takes no proxy from the environment (it would connect for us, unchecked),
    and makes every connection through the guard."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    default = transport._pool
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=default._ssl_context,
        max_connections=10,
        network_backend=GuardedBackend(policy or current_policy()),
    )
    return httpx2.AsyncClient(
        headers=headers,
        transport=transport,
        follow_redirects=False,
        trust_env=False,
        timeout=httpx2.Timeout(30.0, read=300.0),
    )
