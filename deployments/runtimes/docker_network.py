"""Modelship's own place on Docker's networks.

When Modelship runs in a container, engines on its network are reached by their address,
and the on-demand gateway's peer policy needs the networks it is attached to: their subnets,
gateway addresses and first host addresses (connections to a published host port arrive
from those). Outside a container there are none.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

from common.networks import in_container as in_container  # its callers know it here


@dataclass(frozen=True)
class AttachedNetwork:
    name: str
    subnets: tuple[str, ...]
    gateways: tuple[str, ...]
    first_hosts: tuple[str, ...]


def own_container(client: Any) -> Any | None:
    """This process's container, found by the hostname Docker gives it; None outside."""
    if not in_container():
        return None
    import docker.errors  # noqa: PLC0415 - the SDK only where a client is (runtimes/__init__)

    try:
        return client.containers.get(socket.gethostname())
    except docker.errors.DockerException:
        return None


def own_network_names(client: Any) -> set[str]:
    container = own_container(client)
    if container is None:
        return set()
    return set(container.attrs["NetworkSettings"]["Networks"])


def attached_networks(client: Any) -> list[AttachedNetwork]:
    """The networks of Modelship's own container with their addresses; [] outside Docker."""
    networks = []
    for name in sorted(own_network_names(client)):
        config = client.networks.get(name).attrs.get("IPAM", {}).get("Config") or []
        subnets, gateways, first_hosts = [], [], []
        for entry in config:
            if not entry.get("Subnet"):
                continue
            subnet = ipaddress.ip_network(entry["Subnet"], strict=False)
            subnets.append(str(subnet))
            first_hosts.append(str(next(subnet.hosts())))
            if entry.get("Gateway"):
                gateways.append(entry["Gateway"])
        networks.append(AttachedNetwork(name, tuple(subnets), tuple(gateways), tuple(first_hosts)))
    return networks


def url_on_network(container: Any, network: str, port: int) -> str:
    address = container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
    return f"http://{address}:{port}"
