"""Lists of IP networks, as settings and Docker give them: one parser for all of them."""

from __future__ import annotations

import ipaddress
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
