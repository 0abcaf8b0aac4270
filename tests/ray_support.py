"""A real Ray cluster on this machine: a head and two worker nodes, each started with the
`ray` CLI of the ray engine environment (installed on first use), on ports of their own
(never 6379: Redis is there). The workers declare GPUs and a custom resource each, so that
where Ray placed a job is observable. One cluster per test session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments import engine_envs
from deployments.runtimes import process
from tests.conftest import scaled

if TYPE_CHECKING:
    from collections.abc import Iterator

# The simulated engine's command line, as a launch gives it to a runtime.
SIM_ENGINE = [
    *(sys.executable, "-m", "deployments.engines.simulated", "--model", "m"),
    *("--host", "{host}", "--port", "{port}"),
]
# Ray notices a dead node after period x threshold (its defaults take about 20 s).
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}


def free_port() -> int:
    return process.free_port("127.0.0.1")


@dataclass
class Cluster:
    ray: Path
    dashboard: str
    gcs: str
    env: dict[str, str]
    nodes: dict[str, str] = field(default_factory=dict)  # custom resource -> node id

    def start_node(self, resource: str, gpus: int, head: bool = False) -> None:
        ports = [
            *("--node-manager-port", str(free_port())),
            *("--object-manager-port", str(free_port())),
            *("--dashboard-agent-listen-port", str(free_port())),
            *("--dashboard-agent-grpc-port", str(free_port())),
            *("--metrics-export-port", str(free_port())),
            *("--runtime-env-agent-port", str(free_port())),
        ]
        where = (
            [
                *("--head", "--port", self.gcs.rpartition(":")[2]),
                *("--dashboard-host", "127.0.0.1"),
                *("--dashboard-port", self.dashboard.rpartition(":")[2]),
                "--include-dashboard=true",
            ]
            if head
            else ["--address", self.gcs]
        )
        started = subprocess.run(
            [
                str(self.ray),
                "start",
                *where,
                *ports,
                *("--num-cpus", "2", "--num-gpus", str(gpus)),
                *("--resources", json.dumps({resource: 1})),
                "--disable-usage-stats",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=scaled(120),
        )
        if started.returncode:
            raise AssertionError(
                f"ray start ({resource}) failed:\n{started.stdout}{started.stderr}"
            )
        self.nodes[resource] = self.node_with(resource)

    def node_with(self, resource: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + scaled(timeout)
        while True:
            for node in self.state_nodes():
                if node["state"] == "ALIVE" and resource in node.get("resources_total", {}):
                    return str(node["node_id"])
            if time.monotonic() > deadline:
                raise AssertionError(f"no Ray node with {resource} came up")
            time.sleep(0.2)

    def state_nodes(self) -> list[dict[str, Any]]:
        try:
            answer = httpx.get(self.dashboard + "/api/v0/nodes", params={"detail": "1"}, timeout=10)
        except httpx.TransportError:
            return []
        return list(answer.json()["data"]["result"]["result"]) if answer.status_code == 200 else []

    def raylet_pid(self, resource: str) -> int:
        """The raylet of the node that declared `resource` (its command line names it)."""
        found = subprocess.run(["pgrep", "-f", f"raylet.*{resource}"], capture_output=True)
        return int(found.stdout.split()[0])


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Cluster]:
    python = Path(engine_envs.ensure("ray"))
    # A short folder: Ray's sockets live under it, and a Unix socket's path has at most 107
    # bytes (pytest's folder of an xdist worker, popen-gwN/, is already too deep).
    temp = Path(tempfile.mkdtemp(prefix="mship-ray-"))
    env = {
        **os.environ,
        **FAST_HEALTH,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(temp),
    }
    cluster = Cluster(
        ray=python.parent / "ray",
        dashboard=f"http://127.0.0.1:{free_port()}",
        gcs=f"127.0.0.1:{free_port()}",
        env=env,
    )
    try:
        for attempt in (1, 2):
            try:
                cluster.start_node("mship_head", gpus=0, head=True)
                cluster.start_node("worker_a", gpus=2)
                cluster.start_node("worker_b", gpus=1)
                break
            except AssertionError:
                # Ray's own start-up deadline (its GCS answering the new node) can pass on two
                # cores another worker keeps busy (a vLLM test beside it): once more, from
                # nothing, before the suite's Ray tests are called failed.
                if attempt == 2:
                    raise
                subprocess.run([str(cluster.ray), "stop", "--force"], env=env, capture_output=True)
                cluster.nodes.clear()
        yield cluster
    finally:
        subprocess.run([str(cluster.ray), "stop", "--force"], env=env, capture_output=True)
        shutil.rmtree(temp, ignore_errors=True)
