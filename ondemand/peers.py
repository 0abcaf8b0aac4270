"""Who may call the on-demand gateway: the peer policy and the PeerGuard middleware, as the
on-demand seed's check 1 says.

Only peers on Modelship's own Docker networks pass (`MSHIP_ONDEMAND_ALLOWED_CIDRS=auto`), or
an explicit list of networks; never the gateway and first host addresses of those networks
(connections to a published host port arrive from there), never the decider's network, and
never a request that came through a proxy. A refused peer gets 404, as if the route did not
exist. The policy is read at start-up (the gateway's lifespan, else its first request) and
then every 30 s in the background, whether requests come or not: no request waits for a read
after the first, and none after a lull is judged by a policy older than that. Until the first
read nobody passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from common.db_calls import off_loop
from common.networks import networks
from deployments.runtimes import get_runtime
from deployments.runtimes.docker_network import AttachedNetwork, attached_networks, in_container
from openai_api.errors import GatewayError
from openai_api.exchange import Exchange

log = logging.getLogger(__name__)

REFRESH_S = 30.0
FIRST_REFRESH_WAIT_S = 10.0
FORWARDING_HEADERS = (b"x-forwarded-for", b"forwarded", b"x-real-ip")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Scope = dict[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]


@dataclass(frozen=True)
class PeerPolicy:
    allowed: tuple[Network, ...]
    refused_networks: tuple[Network, ...]  # the decider's
    refused_addresses: frozenset[Address]  # gateways and first hosts

    def allows(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a Unix socket or anything else that is not an IP peer
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address in self.refused_addresses:
            return False
        if any(address in net for net in self.refused_networks):
            return False
        return any(address in net for net in self.allowed)


NOBODY = PeerPolicy((), (), frozenset())


def build_policy(
    setting: str, attached: list[AttachedNetwork], decider: AttachedNetwork | None
) -> PeerPolicy:
    """The policy for `setting` ("auto" or a comma-separated list of networks), given the
    networks Modelship's container is attached to and the decider's network."""
    refused_networks = networks(decider.subnets if decider else ())
    refused_addresses = frozenset(
        ipaddress.ip_address(a)
        for network in attached
        for a in (*network.gateways, *network.first_hosts)
    )
    if setting.strip().lower() == "auto":
        allowed = networks(
            s
            for network in attached
            if decider is None or network.name != decider.name
            for s in network.subnets
        )
    else:
        allowed = networks(setting.split(","))
    return PeerPolicy(allowed, refused_networks, refused_addresses)


def read_policy() -> PeerPolicy:
    """The current policy, read from Docker (blocking)."""
    setting = settings.MSHIP_ONDEMAND_ALLOWED_CIDRS
    decider_name = settings.MSHIP_DECIDER_NETWORK
    attached: list[AttachedNetwork] = []
    decider = None
    if in_container() or decider_name:
        client = get_runtime("docker").client  # type: ignore[attr-defined]
        attached = attached_networks(client)
        if decider_name:
            decider = _network(client, decider_name)
    policy = build_policy(setting, attached, decider)
    _warn_overlap(setting, policy)
    return policy


def _network(client: Any, name: str) -> AttachedNetwork:
    import docker.errors  # noqa: PLC0415 - the SDK only where a client is (runtimes/__init__)

    try:
        network = client.networks.get(name)
    except docker.errors.NotFound:
        return AttachedNetwork(name, (), (), ())
    config = network.attrs.get("IPAM", {}).get("Config") or []
    return AttachedNetwork(name, tuple(c["Subnet"] for c in config if c.get("Subnet")), (), ())


_warned: set[PeerPolicy] = set()


def _warn_overlap(setting: str, policy: PeerPolicy) -> None:
    """An explicit list that covers refused addresses is honoured minus them: say so once
    per distinct policy."""
    if setting.strip().lower() == "auto" or policy in _warned:
        return
    covered = [str(a) for a in policy.refused_addresses if any(a in n for n in policy.allowed)]
    covered += [
        str(n) for n in policy.refused_networks if any(n.overlaps(m) for m in policy.allowed)
    ]
    if covered:
        _warned.add(policy)
        log.warning(
            "MSHIP_ONDEMAND_ALLOWED_CIDRS covers %s; those stay refused (Docker gateways, "
            "published-port sources and the decider's network)",
            ", ".join(sorted(covered)),
        )


class PeerGuard:
    """ASGI middleware: refuses what the peer policy does not allow, before routing."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.policy: PeerPolicy | None = None
        self.read_at = float("-inf")
        self._refreshing: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None  # reads it every REFRESH_S

    async def start(self) -> None:
        """The gateway's start: the policy read now (at most FIRST_REFRESH_WAIT_S waited
        for), and kept fresh from then on."""
        self._keep_fresh()
        await asyncio.wait({self._refresh_now()}, timeout=FIRST_REFRESH_WAIT_S)

    async def stop(self) -> None:
        if self._keeper is not None and not self._keeper.done():
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        policy = await self.current()
        client = scope.get("client") or ("", 0)
        headers = {name.lower() for name, _ in scope.get("headers", [])}
        if policy.allows(client[0]) and not headers.intersection(FORWARDING_HEADERS):
            return await self.app(scope, receive, send)
        error = GatewayError(404, f"Unknown path {scope['path']}.", "not_found")
        await Exchange(scope, receive, send).json(error.status, error.body())

    async def current(self) -> PeerPolicy:
        self._keep_fresh()
        if time.monotonic() - self.read_at >= REFRESH_S:
            # Not read yet, or the keeper is late (a slow read): one read, shared.
            refreshing = self._refresh_now()
            if self.policy is None:
                # Nobody passes before the first read; a request at start-up waits for it.
                await asyncio.wait({refreshing}, timeout=FIRST_REFRESH_WAIT_S)
        return self.policy or NOBODY

    def _keep_fresh(self) -> None:
        """The keeper of this event loop: it reads the policy every REFRESH_S, ahead of any
        request, so that none waits for a read or is judged by a stale policy."""
        loop = asyncio.get_running_loop()
        keeper = self._keeper
        if keeper is None or keeper.done() or keeper.get_loop() is not loop:
            self._keeper = loop.create_task(self._keep())

    async def _keep(self) -> None:
        while True:
            began = time.monotonic()
            await asyncio.wait({self._refresh_now()})  # never cancelled half-way by a stop
            await asyncio.sleep(max(0.0, began + REFRESH_S - time.monotonic()))

    def _refresh_now(self) -> asyncio.Task[None]:
        """The read under way in this event loop, or one begun now."""
        loop = asyncio.get_running_loop()
        refreshing = self._refreshing
        if refreshing is None or refreshing.done() or refreshing.get_loop() is not loop:
            refreshing = self._refreshing = loop.create_task(self.refresh())
        return refreshing

    async def refresh(self) -> None:
        try:
            self.policy = await off_loop(read_policy)
        except Exception as exc:  # Docker away: keep the last policy (or nobody)
            log.warning("could not read the on-demand peer policy: %s", exc)
        self.read_at = time.monotonic()
