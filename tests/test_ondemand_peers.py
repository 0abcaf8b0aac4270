"""Who may call /ondemand: the peer policy, built from Modelship's Docker networks, and the
PeerGuard in front of the gateway, run for real in a container on a Docker network."""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
import threading
import uuid
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments.runtimes import get_runtime
from deployments.runtimes.docker_network import AttachedNetwork
from ondemand import peers
from ondemand.peers import build_policy
from tests.conftest import REPO, wait_until
from tests.docker_support import engine_volumes

if TYPE_CHECKING:
    from collections.abc import Iterator

ENGINES = AttachedNetwork("modelship", ("172.30.0.0/16",), ("172.30.0.1",), ("172.30.0.1",))
EXTRA = AttachedNetwork("lan-side", ("10.9.0.0/24",), ("10.9.0.254",), ("10.9.0.1",))
DECIDER = AttachedNetwork("decider", ("172.31.0.0/16",), ("172.31.0.1",), ("172.31.0.1",))


def test_it_allows_the_attached_subnets_minus_gateways_first_hosts_and_the_decider() -> None:
    policy = build_policy("auto", [ENGINES, EXTRA, DECIDER], DECIDER)
    assert policy.allows("172.30.4.7") and policy.allows("10.9.0.7")
    assert policy.allows("::ffff:172.30.4.7")  # an IPv4 peer on a dual-stack socket
    for refused in ("172.30.0.1", "10.9.0.254", "10.9.0.1", "172.31.0.9", "192.168.1.5"):
        assert not policy.allows(refused), refused
    assert not policy.allows("")  # no IP peer (a Unix socket)


def test_it_allows_nobody_on_auto_outside_docker() -> None:
    policy = build_policy("auto", [], None)
    assert not policy.allows("127.0.0.1") and not policy.allows("172.30.4.7")


def test_it_keeps_the_exclusions_under_an_explicit_list_and_warns_once(
    caplog: pytest.LogCaptureFixture, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:

    policy = build_policy("172.16.0.0/12, 10.0.0.0/8", [ENGINES], DECIDER)
    assert policy.allows("172.30.4.7") and policy.allows("10.200.0.1")
    assert not policy.allows("172.30.0.1")  # the engines network's gateway
    assert not policy.allows("172.31.5.5")  # the decider's network, though the list covers it
    monkeypatch.setattr(peers, "attached_networks", lambda client: [ENGINES])
    monkeypatch.setattr(peers, "in_container", lambda: True)
    monkeypatch.setattr(peers, "_network", lambda client, name: DECIDER)
    settings.MSHIP_ONDEMAND_ALLOWED_CIDRS = "172.16.0.0/12"
    settings.MSHIP_DECIDER_NETWORK = "decider"
    monkeypatch.setattr("deployments.runtimes.docker.DockerRuntime.client", object())
    with caplog.at_level(logging.WARNING, logger="ondemand.peers"):
        peers.read_policy()
        peers.read_policy()
    warnings = [r for r in caplog.records if "MSHIP_ONDEMAND_ALLOWED_CIDRS" in r.message]
    assert len(warnings) == 1 and "172.30.0.1" in warnings[0].message


GUARDED_SERVER = textwrap.dedent(
    """
    import django, uvicorn
    django.setup()
    from ondemand.peers import PeerGuard

    async def passed(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"passed"})

    uvicorn.run(PeerGuard(passed), host="0.0.0.0", port=8090, log_level="warning")
    """
)
CALLER = textwrap.dedent(
    """
    import sys, urllib.request, urllib.error
    request = urllib.request.Request(sys.argv[1], headers=dict(h.split(": ") for h in sys.argv[2:]))
    try:
        print(urllib.request.urlopen(request, timeout=10).status)
    except urllib.error.HTTPError as exc:
        print(exc.code)
    """
)


@pytest.fixture
def decider_network(docker_client: Any) -> Iterator[Any]:
    network = docker_client.networks.create(f"mstest-decider-{uuid.uuid4().hex[:6]}")
    yield network
    network.reload()
    for attached in network.containers:
        network.disconnect(attached, force=True)
    network.remove()


def test_it_guards_the_gateway_in_a_container_on_its_docker_networks(
    docker_client: Any, engine_image: str, docker_site: Any, decider_network: Any
) -> None:
    """Modelship's guard in a container attached to the engines' network and the decider's:
    a peer on the engines' network passes; a peer behind a proxy header, a peer on the
    decider's network and the host through the published port are all refused."""
    engines_network = get_runtime("docker").network()  # type: ignore[attr-defined]
    label = {"modelship.site": docker_site.MSHIP_SITE}
    common = {
        "volumes": [*engine_volumes(), "/var/run/docker.sock:/var/run/docker.sock"],
        "working_dir": str(REPO),
        "labels": label,
    }
    guarded = docker_client.containers.run(
        engine_image,
        [sys.executable, "-c", GUARDED_SERVER],
        network=engines_network.name,
        ports={"8090/tcp": ("127.0.0.1", None)},
        environment={
            "DJANGO_SETTINGS_MODULE": "modelship_site.settings",
            "MSHIP_VAR_DIR": "/tmp/modelship",
            "MSHIP_IN_CONTAINER": "1",
            "MSHIP_ONDEMAND_ALLOWED_CIDRS": "auto",
            "MSHIP_DECIDER_NETWORK": decider_network.name,
        },
        detach=True,
        **common,
    )
    decider_network.connect(guarded)
    guarded.reload()
    addresses = {
        name: network["IPAddress"]
        for name, network in guarded.attrs["NetworkSettings"]["Networks"].items()
    }
    port = guarded.attrs["NetworkSettings"]["Ports"]["8090/tcp"][0]["HostPort"]

    def from_host() -> int | None:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code
        except httpx.HTTPError:
            return None

    wait_until(lambda: from_host() is not None, 60)
    assert from_host() == 404  # the published port: it arrives from the network's gateway

    def call(network: str, *headers: str) -> int:
        out = docker_client.containers.run(
            engine_image,
            [sys.executable, "-c", CALLER, f"http://{addresses[network]}:8090/", *headers],
            network=network,
            remove=True,
            **common,
        )
        return int(out.decode().strip())

    assert call(engines_network.name) == 200
    assert call(engines_network.name, "X-Forwarded-For: 10.0.0.1") == 404
    assert call(decider_network.name) == 404


class Asker:
    """What a guarded app was reached by, and a GET of the on-demand models from 127.0.0.1
    through the guard, with what the guard answered."""

    def __init__(self) -> None:
        self.reached: list[str] = []
        self.sent: list[dict[str, Any]] = []

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached.append(scope["path"])

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def get(self, guard: peers.PeerGuard) -> None:
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/ondemand/1/v1/models",
            "headers": [],
            "client": ("127.0.0.1", 5000),
        }
        await guard(scope, self.receive, self.send)


async def test_it_lets_nobody_through_before_the_first_policy_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Docker slow to answer at start-up: a request waits a while for the first read, then
    is refused as if the route did not exist; once the read is in, the peer passes."""
    docker_answers = threading.Event()

    def slow_read() -> peers.PeerPolicy:
        docker_answers.wait(30)
        return build_policy("127.0.0.1/32", [], None)

    monkeypatch.setattr(peers, "read_policy", slow_read)
    monkeypatch.setattr(peers, "FIRST_REFRESH_WAIT_S", 0.1)
    asker = Asker()
    guard = peers.PeerGuard(asker.app)
    await asker.get(guard)
    assert asker.reached == [] and asker.sent[0]["status"] == 404
    docker_answers.set()
    assert guard._refreshing is not None
    await guard._refreshing
    await asker.get(guard)
    assert asker.reached == ["/ondemand/1/v1/models"]


async def test_it_reads_the_policy_at_start_and_again_ahead_of_any_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read at the gateway's start, so that its first request waits for no read, and again
    every REFRESH_S whether requests come or not: after a lull, the request is judged by the
    policy read meanwhile, not by the one of before the lull."""
    docker_says = ["127.0.0.1/32"]
    reads: list[str] = []
    read_again = threading.Event()

    def read() -> peers.PeerPolicy:
        reads.append(docker_says[0])
        if docker_says[0] != "127.0.0.1/32":
            read_again.set()
        return build_policy(docker_says[0], [], None)

    monkeypatch.setattr(peers, "read_policy", read)
    monkeypatch.setattr(peers, "REFRESH_S", 0.05)
    asker = Asker()
    guard = peers.PeerGuard(asker.app)
    await guard.start()
    try:
        assert reads == ["127.0.0.1/32"]  # before any request
        await asker.get(guard)
        assert asker.reached == ["/ondemand/1/v1/models"]
        docker_says[0] = "10.0.0.0/8"  # the lull: no request comes while Docker changes
        assert await asyncio.to_thread(read_again.wait, 10)
        assert guard._refreshing is not None
        await asyncio.wait({guard._refreshing})  # the read that saw it, or a later one
        await asker.get(guard)
        assert asker.reached == ["/ondemand/1/v1/models"] and asker.sent[0]["status"] == 404
    finally:
        await guard.stop()
