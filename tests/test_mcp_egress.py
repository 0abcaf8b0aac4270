"""The MCP egress policy as a table, and its second check at connect time."""

from __future__ import annotations

import ipaddress
import socket

import httpx2
import pytest

from openai_api.mcp.egress import EgressRefused, Policy, host_networks, http_client, normalise


def policy(allowed: list[str] = (), engines: list[str] = ()) -> Policy:  # type: ignore[assignment]
    return Policy(
        allowed_names=frozenset(allowed),
        allowed_networks=host_networks(allowed),
        engine_networks=host_networks(engines),
        require_https=False,
    )


@pytest.mark.parametrize(
    ("host", "address", "allowed", "refused_because"),
    [
        ("tools.example", "93.184.216.34", [], None),
        ("lan-tools", "10.1.2.3", [], None),  # private networks are fine
        ("x", "169.254.169.254", [], "metadata"),
        ("x", "169.254.169.254", ["x", "169.254.0.0/16"], "metadata"),  # never, even named
        ("x", "100.100.100.200", [], "metadata"),  # Alibaba
        ("x", "::ffff:169.254.169.254", [], "metadata"),
        ("x", "::ffff:a9fe:a9fe", [], "metadata"),
        ("x", "fd00:ec2::254", [], "metadata"),
        ("metadata.google.internal", "10.0.0.1", [], "metadata"),
        ("localhost", "127.0.0.1", [], "loopback"),
        ("x", "127.8.9.10", [], "loopback"),
        ("x", "::1", [], "loopback"),
        ("x", "::ffff:127.0.0.1", [], "loopback"),
        ("x", "::127.0.0.1", [], "loopback"),  # IPv4-compatible IPv6
        ("x", "0.0.0.0", [], "loopback"),
        ("x", "fe80::1%eth0", [], "loopback"),
        ("x", "127.0.0.1", ["127.0.0.1"], None),
        ("tools", "127.0.0.1", ["tools"], None),
        ("x", "127.0.0.5", ["127.0.0.0/8"], None),
        ("x", "172.30.0.7", [], "engines"),  # an engine's Docker network
        ("x", "172.30.0.7", ["172.30.0.7"], None),
        ("y", "93.184.216.34", ["tools"], "MSHIP_MCP_ALLOWED_HOSTS"),
    ],
)
def test_it_decides_each_address_by_the_table(
    host: str, address: str, allowed: list[str], refused_because: str | None
) -> None:
    why = policy(allowed, engines=["172.30.0.0/16", "127.0.0.1"]).verdict(host, normalise(address))
    if refused_because is None:
        assert why is None
    else:
        assert why is not None and refused_because in why


def test_it_reads_decimal_and_octal_spellings_as_the_same_address() -> None:
    for spelling in ("2130706433", "0177.0.0.1", "0x7f.1"):
        resolved = socket.getaddrinfo(spelling, 80, type=socket.SOCK_STREAM)[0][4][0]
        assert normalise(str(resolved)) == ipaddress.ip_address("127.0.0.1")


async def test_it_checks_the_address_again_when_it_connects() -> None:
    """A name that passed the first check and then resolves to loopback (DNS rebinding):
    the connection itself is refused, whatever the first check said."""
    async with http_client({}, policy()) as http:
        with pytest.raises(EgressRefused):
            await http.get("http://localhost:9/mcp")
    async with http_client({}, policy(allowed=["localhost"])) as http:
        with pytest.raises(httpx2.ConnectError):  # allowed: a real attempt (nothing listens)
            await http.get("http://localhost:9/mcp")
