"""The ray runtime on a real local Ray cluster (tests/ray_support.py) keeps the engine's secrets
out of what the dashboard shows, and its engine off every interface but its node's own."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments.runtimes.base import Launch
from deployments.runtimes.ray import RayRuntime
from tests.conftest import answers, wait_until
from tests.ray_support import SIM_ENGINE

if TYPE_CHECKING:
    from tests.ray_support import Cluster

pytestmark = pytest.mark.heavy
TOKEN = "hf_only_the_engine_sees_this"


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hexport = local.rpartition(":")
                if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_it_keeps_the_engines_environment_out_of_the_job_and_binds_the_node_only(
    ray_cluster: Cluster, settings: Any, tmp_path: Any
) -> None:
    settings.MSHIP_RAY_ADDRESS = ray_cluster.dashboard
    settings.MSHIP_STOP_GRACE_S = 3
    settings.MSHIP_RAY_SECRETS_DIR = tmp_path / "ray-env"
    ray = RayRuntime()
    launch = Launch(
        deployment_id=8,
        name="sim",
        replica=0,
        argv=SIM_ENGINE,
        health_path="/health",
        fingerprint="e" * 12,
        env={"HF_TOKEN": TOKEN},
        memory_gib=0.5,
        resources={"worker_a": 0.1},
    )
    handle = ray.launch(launch)
    try:
        # What anyone who reaches the dashboard reads of the job: no token.
        shown = httpx.get(f"{ray_cluster.dashboard}/api/jobs/{handle['job']}", timeout=10)
        assert shown.status_code == 200 and TOKEN not in shown.text
        assert TOKEN not in ray.log_tail(handle, 200)
        # The engine has it, read from the file, which is gone.
        wait_until(lambda: answers(handle["url"] + "/health"), 60)
        pid = httpx.get(handle["url"] + "/sim/stats", timeout=10).json()["pid"]
        with open(f"/proc/{pid}/environ", "rb") as environ:
            assert f"HF_TOKEN={TOKEN}".encode() in environ.read().split(b"\0")
        assert os.listdir(settings.MSHIP_RAY_SECRETS_DIR) == []
        # It listens on the node's address, the one the URL names, and on no other.
        assert handle["url"] == f"http://{handle['node_ip']}:{handle['port']}"
        bound = listening_addresses(handle["port"])
        assert bound and not bound & {"00000000", "00000000000000000000000000000000"}, bound
    finally:
        ray.stop(handle, 3)
