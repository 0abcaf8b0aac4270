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

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpcore2
import httpx2
from django.conf import settings

from common.networks import Network, networks
from openai_api.catalog import catalog
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
METADATA_NETWORKS: tuple[Network, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),  # AWS, GCP, Azure, OpenStack
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS over IPv6
)


def refused(url: str, why: str) -> GatewayError:
    return GatewayError(400, f"The MCP server {url} is not allowed: {why}.", "mcp_egress_refused")


def normalise(address: str) -> Address:
    """One spelling per address: the zone dropped, IPv4 inside IPv6 taken out."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.packed[:12] == bytes(12) and int(ip) > 1:  # IPv4-compatible (::a.b.c.d)
            return ipaddress.IPv4Address(ip.packed[12:])
    return ip


@dataclass(frozen=True)
class Policy:
    allowed_names: frozenset[str]
    allowed_networks: tuple[Network, ...]
    engine_networks: tuple[Network, ...]
    require_https: bool

    @property
    def has_allow_list(self) -> bool:
        return bool(self.allowed_names or self.allowed_networks)

    def listed(self, host: str, ip: Address | None) -> bool:
        if host in self.allowed_names:
            return True
        return ip is not None and any(ip in network for network in self.allowed_networks)

    def verdict(self, host: str, ip: Address) -> str | None:
        """Why a connection to `host` at `ip` is refused; None when it is allowed."""
        if host in METADATA_HOSTS or any(ip in n for n in METADATA_NETWORKS):
            return "cloud metadata endpoints are never reachable"
        if self.listed(host, ip):
            return None
        if self.has_allow_list:
            return "its host is not in MSHIP_MCP_ALLOWED_HOSTS"
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            return "loopback and link-local addresses need MSHIP_MCP_ALLOWED_HOSTS"
        if any(ip in network for network in self.engine_networks):
            return "it is one of Modelship's engines (MSHIP_MCP_ALLOWED_HOSTS can name it)"
        return None


def host_networks(hosts: Iterable[str]) -> tuple[Network, ...]:
    """The addresses and networks among host names."""
    return networks(hosts, skip_names=True)


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
    )


async def resolve(host: str, port: int) -> list[Address]:
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [normalise(str(info[4][0])) for info in found]


async def check(
    url: str, policy: Policy | None = None, refuse: Callable[[str, str], Exception] = refused
) -> None:
    """400 `mcp_egress_refused` unless the policy allows connecting to `url` (another
    refusal where `refuse` makes one: an input image's URL is no MCP server)."""
    policy = policy or current_policy()
    parts = urlsplit(url)
    try:
        host = (parts.hostname or "").lower().rstrip(".")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise refuse(url, "its port is not a number") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise refuse(url, "it must be an http(s) URL with a host")
    if policy.require_https and parts.scheme != "https":
        raise refuse(url, "this site requires https (MSHIP_MCP_REQUIRE_HTTPS)")
    if host in METADATA_HOSTS:
        raise refuse(url, "cloud metadata endpoints are never reachable")
    if policy.has_allow_list and not policy.listed(host, literal(host)):
        raise refuse(url, "its host is not in MSHIP_MCP_ALLOWED_HOSTS")
    try:
        addresses = await resolve(host, port)
    except OSError as exc:
        raise refuse(url, "its host does not resolve") from exc
    for ip in addresses:
        why = policy.verdict(host, ip)
        if why is not None:
            raise refuse(url, why)


def literal(host: str) -> Address | None:
    try:
        return normalise(host.strip("[]"))
    except ValueError:
        return None


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
