"""The MCP egress policy as a table, and its second check at connect time."""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import TYPE_CHECKING, Any

import httpx2
import pytest

from common import egress as common_egress
from deployments.store import web
from openai_api.errors import GatewayError
from openai_api.mcp.egress import (
    EgressRefused,
    Policy,
    check,
    host_networks,
    http_client,
    normalise,
)
from openai_api.responses.remote_images import fetch_images

if TYPE_CHECKING:
    from pathlib import Path


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


# --- the Docker bridge gateway: the host, seen from a container ------------------------------


def hexed(address: str) -> str:
    """An IPv4 address as /proc/net/route writes it: its bytes read as a native integer."""
    return f"{struct.unpack('=L', ipaddress.IPv4Address(address).packed)[0]:08X}"


@pytest.fixture
def compose_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a container of a compose project: on its default network (eth0,
    172.18.0.0/16, its way out through the bridge 172.18.0.1) and on another (eth1,
    172.19.0.0/16, no route through it), with IPv6 out through fd00::1."""
    head = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
    routes = [
        ("eth0", "0.0.0.0", "172.18.0.1", "0.0.0.0"),
        ("eth0", "172.18.0.0", "0.0.0.0", "255.255.0.0"),
        ("eth1", "172.19.0.0", "0.0.0.0", "255.255.0.0"),
        ("lo", "127.0.0.0", "0.0.0.0", "255.0.0.0"),
    ]
    lines = [head] + [
        f"{i}\t{hexed(d)}\t{hexed(g)}\t0003\t0\t0\t0\t{hexed(m)}\t0\t0\t0" for i, d, g, m in routes
    ]
    (tmp_path / "route").write_text("\n".join(lines) + "\n")
    zero = "0" * 32
    (tmp_path / "route6").write_text(
        f"{zero} 00 {zero} 00 fd{'0' * 29}1 00000400 00000002 00000000 00000003 eth0\n"
        f"fd{'0' * 30} 40 {zero} 00 {zero} 00000100 00000001 00000000 00000001 eth0\n"
        f"fe80{'0' * 28} 40 {zero} 00 {zero} 00000100 00000001 00000000 00000001 eth0\n"
    )
    for name in ("fib", "inet6"):
        (tmp_path / name).write_text("")
        monkeypatch.setitem(common_egress.TABLES, name, str(tmp_path / name))
    monkeypatch.setitem(common_egress.TABLES, "route", str(tmp_path / "route"))
    monkeypatch.setitem(common_egress.TABLES, "route6", str(tmp_path / "route6"))
    monkeypatch.setenv("MSHIP_IN_CONTAINER", "1")


GATEWAYS = ("172.18.0.1", "172.19.0.1", "fd00::1")


@pytest.mark.usefixtures("compose_container")
def test_it_counts_the_docker_bridge_gateways_of_a_container_as_its_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert {str(a) for a in common_egress.own_addresses()} == set(GATEWAYS)
    # Outside a container, a route's gateway is a router, and private networks are fine.
    monkeypatch.setenv("MSHIP_IN_CONTAINER", "0")
    assert common_egress.own_addresses() == frozenset()


@pytest.mark.usefixtures("compose_container")
async def test_it_refuses_an_mcp_server_and_an_input_image_at_a_bridge_gateway(
    settings: Any,
) -> None:
    settings.MSHIP_MCP_ALLOWED_HOSTS = []
    for address in GATEWAYS:
        url = f"http://{'[' + address + ']' if ':' in address else address}:8080/mcp"
        with pytest.raises(GatewayError) as refused:
            await check(url)
        assert refused.value.code == "mcp_egress_refused"
        assert "Docker bridge gateway" in refused.value.message
    image = {"type": "input_image", "image_url": "http://172.19.0.1/cat.png"}
    with pytest.raises(GatewayError) as refused:
        await fetch_images([{"role": "user", "content": [image]}], [], "previous_response_id")
    assert refused.value.code == "invalid_image_url"
    assert "Docker bridge gateway" in refused.value.message
    await check("http://172.18.0.5:8080/mcp")  # another container on the network: fine


@pytest.mark.usefixtures("compose_container")
def test_it_refuses_a_pull_from_a_bridge_gateway(settings: Any, db: None) -> None:
    settings.MSHIP_MCP_ALLOWED_HOSTS = []
    why = web.refusal("http://172.18.0.1:8000/model.gguf", web.pull_policy())
    assert why is not None and "Docker bridge gateway" in why
