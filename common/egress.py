"""Where Modelship may connect on someone's behalf: a caller's MCP server, an input image's
URL, a model an operator pulls by URL. The policy is pure (a verdict per host and address);
each caller builds one from its settings and the engines it knows, and checks the address a
connection is really made to, after resolution (decimal, octal, IPv4-mapped and
IPv4-compatible IPv6 spellings all meet the same rules)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpcore
import httpx

from common.networks import Network, bridge_gateways, in_container, networks

if TYPE_CHECKING:
    from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
METADATA_NETWORKS: tuple[Network, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),  # AWS, GCP, Azure, OpenStack
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS over IPv6
)


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
    # This host's own addresses (its interfaces; in a container, the Docker bridge gateways
    # that lead to its host), where services bound to every address answer.
    own_addresses: frozenset[Address] = frozenset()

    @property
    def has_allow_list(self) -> bool:
        return bool(self.allowed_names or self.allowed_networks)

    def listed(self, host: str, ip: Address | None) -> bool:
        if host in self.allowed_names:
            return True
        return ip is not None and any(ip in network for network in self.allowed_networks)

    def url_problem(self, url: str) -> tuple[str, int, str | None]:
        """The URL's host and port, and why it is refused before resolving it (None: it
        may be resolved and each address judged by `verdict`)."""
        parts = urlsplit(url)
        try:
            host = (parts.hostname or "").lower().rstrip(".")
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return "", 0, "its port is not a number"
        if parts.scheme not in ("http", "https") or not host:
            return host, port, "it must be an http(s) URL with a host"
        if self.require_https and parts.scheme != "https":
            return host, port, "this site requires https (MSHIP_MCP_REQUIRE_HTTPS)"
        if host in METADATA_HOSTS:
            return host, port, "cloud metadata endpoints are never reachable"
        if self.has_allow_list and not self.listed(host, literal(host)):
            return host, port, "its host is not in MSHIP_MCP_ALLOWED_HOSTS"
        return host, port, None

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
        if ip in self.own_addresses:
            return (
                "it is this host's own address or a Docker bridge gateway to it"
                " (MSHIP_MCP_ALLOWED_HOSTS can name it)"
            )
        return None


def host_networks(hosts: Iterable[str]) -> tuple[Network, ...]:
    """The addresses and networks among host names."""
    return networks(hosts, skip_names=True)


async def resolve(host: str, port: int) -> list[Address]:
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [normalise(str(info[4][0])) for info in found]


# Linux's tables of this host's addresses and routes (a test points them at its own).
TABLES = {
    "fib": "/proc/net/fib_trie",
    "inet6": "/proc/net/if_inet6",
    "route": "/proc/net/route",
    "route6": "/proc/net/ipv6_route",
}
_own: dict[tuple[object, ...], tuple[float, frozenset[Address]]] = {}


def own_addresses() -> frozenset[Address]:
    """The addresses that are this host: its interfaces' (Linux's tables; none elsewhere)
    and, in a container, the Docker bridge gateways that lead to the host it runs on
    (common/networks.bridge_gateways), where the host's services bound to every address
    answer as they do on loopback. Read again at most once a minute."""
    container = in_container()
    key = (*TABLES.values(), container)
    at, found = _own.get(key, (float("-inf"), frozenset()))
    if time.monotonic() - at < 60:
        return found
    found = interface_addresses(TABLES["fib"], TABLES["inet6"])
    if container:
        found |= bridge_gateways(TABLES["route"], TABLES["route6"])
    _own.clear()  # one entry: the tables in use
    _own[key] = (time.monotonic(), found)
    return found


def interface_addresses(fib: str, inet6: str) -> frozenset[Address]:
    found: set[Address] = set()
    try:
        last = ""
        for line in Path(fib).read_text().splitlines():
            text = line.strip()
            if text.startswith(("|--", "+--")):
                last = text.split()[-1]
            elif text.startswith("/32 host LOCAL") and last:
                found.add(normalise(last))
        for line in Path(inet6).read_text().splitlines():
            found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)


def resolve_now(host: str, port: int) -> list[Address]:
    """`resolve`, for a thread that may block."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [normalise(str(info[4][0])) for info in found]


def literal(host: str) -> Address | None:
    try:
        return normalise(host.strip("[]"))
    except ValueError:
        return None


class EgressRefused(OSError):
    """A connection the policy refuses at connect time (DNS rebinding and the like)."""


class GuardedSyncBackend(httpcore.NetworkBackend):
    """A blocking httpcore network backend that resolves a name once, checks every address,
    and connects to a checked one (TLS still names the host), so the address checked is the
    address used, on every hop of a redirect too."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        name = host.lower().rstrip(".")
        try:
            addresses = resolve_now(name, port)
        except OSError as exc:
            raise EgressRefused(f"{name} does not resolve") from exc
        for ip in addresses:
            if (why := self.policy.verdict(name, ip)) is not None:
                raise EgressRefused(f"{name} is not reachable from here: {why}")
        return self.inner.connect_tcp(
            str(addresses[0]), port, timeout, local_address, socket_options
        )

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        raise EgressRefused("unix sockets are not reachable")


def guarded_client(policy: Policy, timeout: httpx.Timeout) -> httpx.Client:
    """A blocking httpx client whose every connection the policy checks; it takes no proxy
    from the environment (the proxy would connect for us, unchecked)."""
    transport = httpx.HTTPTransport(trust_env=False)
    default = transport._pool
    transport._pool = httpcore.ConnectionPool(
        ssl_context=default._ssl_context,
        max_connections=4,
        network_backend=GuardedSyncBackend(policy),
    )

    def each_hop(request: httpx.Request) -> None:  # a redirect to http meets the rule too
        if policy.require_https and request.url.scheme != "https":
            raise EgressRefused(f"{request.url} is not https (MSHIP_MCP_REQUIRE_HTTPS)")

    return httpx.Client(
        transport=transport,
        follow_redirects=True,
        max_redirects=5,
        trust_env=False,
        timeout=timeout,
        event_hooks={"request": [each_hop]},
    )
