"""Where the gateway may connect for a request's MCP servers.

Permissive by default (plain http, localhost and private addresses are fine: a self-hosted
MCP server rarely has a certificate), except cloud metadata endpoints, which are refused by
name and by every address the name resolves to, so numeric or DNS tricks do not get
through. MSHIP_MCP_ALLOWED_HOSTS and MSHIP_MCP_REQUIRE_HTTPS lock it down.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from openai_api.errors import GatewayError

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
METADATA_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)


def refused(url: str, why: str) -> GatewayError:
    return GatewayError(400, f"The MCP server {url} is not allowed: {why}.", "mcp_egress_refused")


def metadata_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in METADATA_NETWORKS)


async def check(url: str) -> None:
    """400 `mcp_egress_refused` unless the policy allows connecting to `url`."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if parts.scheme not in ("http", "https") or not host:
        raise refused(url, "it must be an http(s) URL with a host")
    if settings.MSHIP_MCP_REQUIRE_HTTPS and parts.scheme != "https":
        raise refused(url, "this site requires https (MSHIP_MCP_REQUIRE_HTTPS)")
    allowed = [h.lower() for h in settings.MSHIP_MCP_ALLOWED_HOSTS]
    if allowed and host not in allowed:
        raise refused(url, "its host is not in MSHIP_MCP_ALLOWED_HOSTS")
    if host in METADATA_HOSTS:
        raise refused(url, "cloud metadata endpoints are never reachable")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise refused(url, f"its host does not resolve ({exc})") from exc
    if any(metadata_address(str(info[4][0])) for info in found):
        raise refused(url, "it resolves to a cloud metadata address")
