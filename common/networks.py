"""Lists of IP networks, as settings and Docker give them: one parser for all of them; and
the addresses a container reaches its host by."""

from __future__ import annotations

import ipaddress
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(values: Iterable[str], *, skip_names: bool = False) -> tuple[Network, ...]:
    """Each value as a network: a CIDR, or an address (a /32 or /128), IPv6 with or without
    brackets. A value that is neither raises ValueError, or, with `skip_names`, is left out
    (a list that mixes host names with addresses, such as MCP's allowed hosts)."""
    found = []
    for value in values:
        text = value.strip().strip("[]")
        if not text:
            continue
        try:
            found.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            if not skip_names:
                raise
    return tuple(found)


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def in_container() -> bool:
    """MSHIP_IN_CONTAINER=1 or 0 says so; else Docker's marker file tells."""
    said = os.environ.get("MSHIP_IN_CONTAINER", "")
    if said in ("0", "1"):
        return said == "1"
    return Path("/.dockerenv").exists()


def bridge_gateways(
    route: str = "/proc/net/route", route6: str = "/proc/net/ipv6_route"
) -> frozenset[Address]:
    """Where a container reaches the host it runs on, read from its routing tables (Linux's;
    none elsewhere): every route's gateway (the default route's is its Docker network's
    bridge, the host) and the first address of each network it is on directly (Docker gives
    a network's bridge that address, unless its IPAM config names another): a compose
    network it has no route through leads to the host too. Outside a container these are
    routers and other hosts; ask in one only."""
    found: set[Address] = set()
    try:
        for line in Path(route).read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8 or fields[0] == "lo":
                continue
            # Each address as the kernel holds it: network order read as a native integer.
            gateway, destination, mask = (
                ipaddress.IPv4Address(struct.pack("=L", int(fields[i], 16))) for i in (2, 1, 7)
            )
            if int(gateway):
                found.add(gateway)
            elif int(mask) and int(mask) != 0xFFFFFFFF:
                found.add(next(ipaddress.IPv4Network(f"{destination}/{mask}").hosts()))
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    try:
        for line in Path(route6).read_text().splitlines():
            fields = line.split()
            if len(fields) < 10 or fields[9] == "lo":
                continue
            network = ipaddress.IPv6Network((int(fields[0], 16), int(fields[1], 16)))
            next_hop = ipaddress.IPv6Address(int(fields[4], 16))
            scoped = network.is_link_local or network.is_multicast
            if int(next_hop):
                found.add(next_hop)
            elif 0 < network.prefixlen < 127 and not scoped:
                found.add(next(network.hosts()))
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    return frozenset(found)
