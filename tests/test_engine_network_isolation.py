"""Engines reach Modelship and nothing else, on a real Docker Engine: compose.yaml's networks
as it declares them, with stand-ins for its services (the locally built engine image,
tests/docker_support.py): an engine on the engines' network connects to the gateway and to
neither PostgreSQL nor Redis nor a metadata endpoint; and the docker runtime refuses to
start engines on an internal network it could not reach them on."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from deployments import deployer
from deployments.models import Deployment, State
from tests.conftest import REPO, scaled
from tests.docker_support import docker_block, engine_volumes

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


# Listens on a port (a stand-in for a service), or says whether a connection gets through.
LISTEN = (
    "import http.server as h\n"
    "h.HTTPServer(('0.0.0.0', {port}), h.BaseHTTPRequestHandler).serve_forever()\n"
)
PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(({host!r}, {port}), timeout=3).close()\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__, exc)\n"
    "    sys.exit(1)\n"
)


class Topology:
    """compose.yaml's networks, made as it declares them (named for one test), with stand-in
    services on the networks compose.yaml gives them, and probes from a network."""

    def __init__(self, client: Any, image: str) -> None:
        self.client, self.image = client, image
        self.compose = yaml.safe_load((REPO / "compose.yaml").read_text())
        self.suffix = uuid.uuid4().hex[:8]
        self.networks = {
            key: client.networks.create(
                f"mstest-{key}-{self.suffix}", driver="bridge", internal=bool(spec.get("internal"))
            )
            for key, spec in self.compose["networks"].items()
        }
        self.started: list[Any] = []

    def service(self, name: str, port: int) -> Any:
        keys = list(self.compose["services"][name].get("networks") or [])
        box = self.client.containers.create(
            self.image,
            ["python3", "-c", LISTEN.format(port=port)],
            name=f"mstest-{name}-{self.suffix}",
            volumes=engine_volumes(),
            network=self.networks[keys[0]].name,
            detach=True,
        )
        self.started.append(box)
        self.networks[keys[0]].disconnect(box)  # joined again below, with its service name
        for key in keys:
            self.networks[key].connect(box, aliases=[name])
        box.start()
        box.reload()
        return box

    def probe(self, network_key: str, host: str, port: int) -> tuple[bool, str]:
        """Whether a container on that network connects to host:port, and what it said."""
        return self.probes(network_key, [(host, port)])[0]

    def probes(self, network_key: str, targets: list[tuple[str, int]]) -> list[tuple[bool, str]]:
        """probe() for each target, the containers side by side (an unreachable address
        takes the probe's whole connect timeout)."""
        boxes = []
        for host, port in targets:
            boxes.append(
                self.client.containers.run(
                    self.image,
                    ["python3", "-c", PROBE.format(host=host, port=port)],
                    volumes=engine_volumes(),
                    network=self.networks[network_key].name,
                    detach=True,
                )
            )
            self.started.append(boxes[-1])
        codes = [box.wait(timeout=scaled(60))["StatusCode"] for box in boxes]
        return [(code == 0, box.logs().decode()) for code, box in zip(codes, boxes, strict=True)]

    def close(self) -> None:
        for box in self.started:
            box.remove(force=True)
        for network in self.networks.values():
            network.remove()


@pytest.fixture
def topology(docker_client: Any, engine_image: str) -> Iterator[Topology]:
    made = Topology(docker_client, engine_image)
    try:
        yield made
    finally:
        made.close()


def address(box: Any, network: Any) -> str:
    return str(box.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"])


def test_it_lets_an_engine_reach_the_gateway_and_not_the_database_redis_or_out(
    topology: Topology,
) -> None:
    compose = topology.compose
    engines = next(
        key
        for key, spec in compose["networks"].items()
        if spec["name"] == compose["services"]["web"]["environment"]["MSHIP_DOCKER_NETWORK"]
    )
    web = topology.service("web", 8000)
    postgres = topology.service("postgres", 5432)
    redis = topology.service("redis", 6379)
    networks = topology.networks
    control = next(key for key in networks if key != engines)
    # What a real service on the control network sees: the database and Redis are there.
    assert topology.probe(control, "postgres", 5432)[0]
    assert topology.probe(control, "redis", 6379)[0]
    # An engine: the gateway, by its name and its address on the engines' network...
    assert topology.probe(engines, "web", 8000)[0]
    assert topology.probe(engines, address(web, networks[engines]), 8000)[0]
    # ...and nothing else: not by name, not by address, not through the gateway's other side.
    refused = [
        ("postgres", 5432),
        ("redis", 6379),
        (address(postgres, networks[control]), 5432),
        (address(redis, networks[control]), 6379),
        (address(web, networks[control]), 8000),
        ("169.254.169.254", 80),
    ]
    for (host, port), (reached, said) in zip(
        refused, topology.probes(engines, refused), strict=True
    ):
        assert not reached, f"an engine reached {host}:{port}"
        assert said.strip(), host  # refused, unresolvable or unroutable, as it said


@pytest.mark.usefixtures("engines", "docker_site")
def test_it_refuses_to_start_engines_on_an_internal_network_it_cannot_reach(
    make_deployment: Callable[..., Deployment], docker_client: Any, site: Any
) -> None:
    name = f"mstest-internal-{uuid.uuid4().hex[:8]}"
    network = docker_client.networks.create(name, driver="bridge", internal=True)
    try:
        site.MSHIP_DOCKER_NETWORK = name
        deployment = make_deployment("box", runtime="docker", docker_options=docker_block())
        deployer.restart(deployment.pk)
        deployment.refresh_from_db()
        assert deployment.state == State.FAILED
        assert f"the engines' network {name!r} is internal" in deployment.state_reason
        assert not docker_client.containers.list(
            all=True, filters={"label": f"modelship.site={site.MSHIP_SITE}"}
        )
    finally:
        network.remove()
