"""The ray runtime on a real local Ray cluster (tests/ray_support.py): engines placed by their
resources on worker nodes, served from there, stopped, failed with Ray's reasons."""

from __future__ import annotations

import os
import signal
import socket
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments.runtimes.base import EngineUnreachable, Launch, RuntimeError_
from deployments.runtimes.ray import RayRuntime
from tests.conftest import answers, wait_until
from tests.ray_support import SIM_ENGINE

if TYPE_CHECKING:
    from tests.ray_support import Cluster

pytestmark = pytest.mark.heavy


@pytest.fixture
def ray(ray_cluster: Cluster, settings: Any) -> RayRuntime:
    settings.MSHIP_RAY_ADDRESS = ray_cluster.dashboard
    settings.MSHIP_STOP_GRACE_S = 3
    return RayRuntime()


def launch(resources: dict[str, float] | None = None, gpus: float | None = None) -> Launch:
    return Launch(
        deployment_id=7,
        name="sim",
        replica=0,
        argv=SIM_ENGINE,
        health_path="/health",
        fingerprint="f" * 12,
        num_gpus=gpus,
        memory_gib=0.5,
        resources=resources or {},
    )


def refused(url: str) -> bool:
    host, _, port = url.removeprefix("http://").rpartition(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


def test_it_places_an_engine_where_its_resources_are_and_serves_from_there(
    ray: RayRuntime, ray_cluster: Cluster
) -> None:
    handle = ray.launch(launch({"worker_b": 0.1}, gpus=1))
    try:
        assert handle["node_id"] == ray_cluster.nodes["worker_b"]
        wait_until(lambda: answers(handle["url"] + "/health"), 60)
        answer = httpx.post(
            handle["url"] + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert answer.status_code == 200
        assert ray.is_alive(handle)
        running = [h["job"] for h in ray.managed() or [] if h["status"] == "running"]
        assert running == [handle["job"]]  # ended jobs of other tests stay listed
        assert "Running entrypoint" in ray.log_tail(handle, 50)
    finally:
        ray.stop(handle, 3)
    assert not ray.is_alive(handle)
    assert refused(handle["url"])  # the engine went with its job
    assert "stopped" in ray.exit_reason(handle)


def test_it_fails_a_start_ray_cannot_place_with_rays_reason(
    ray: RayRuntime, ray_cluster: Cluster, settings: Any
) -> None:
    settings.MSHIP_START_TIMEOUT_S = 2
    with pytest.raises(RuntimeError_, match=r"Ray could not place it within 2 s .*resources"):
        ray.launch(launch({"roomy": 1}))
    (left,) = [h for h in ray.managed() or [] if h["status"] == "pending"]
    # Ray runs a stop only once the job's supervisor is placed: with room, the job ends at
    # once instead of serving.
    ray_cluster.start_node("roomy", gpus=0)
    wait_until(lambda: not ray.is_alive(left), 60)
    reason = ray.exit_reason(left)
    # Ray's own race: a stop that lands as the supervisor starts the job's process kills it
    # before the supervisor watches it, and the job fails with psutil's NoSuchProcess.
    assert reason == "Job was intentionally stopped." or (
        "psutil.NoSuchProcess: process PID not found" in reason
    ), reason


def test_it_reports_a_lost_node(ray: RayRuntime, ray_cluster: Cluster) -> None:
    handle = ray.launch(launch({"worker_a": 0.1}))
    try:
        os.kill(ray_cluster.raylet_pid("worker_a"), signal.SIGKILL)
        wait_until(lambda: not ray.is_alive(handle), 60)
        assert "node has died" in ray.exit_reason(handle)
        wait_until(lambda: refused(handle["url"]), 30)  # and its engine did not outlive it
    finally:
        ray_cluster.start_node("worker_a", gpus=2)  # the cluster as the session found it


def test_it_says_ray_is_unreachable(settings: Any) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        settings.MSHIP_RAY_ADDRESS = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(EngineUnreachable, match="Ray is unreachable"):
        RayRuntime().launch(launch())


def test_it_needs_an_address(settings: Any) -> None:
    settings.MSHIP_RAY_ADDRESS = ""
    assert RayRuntime().managed() == []
    with pytest.raises(RuntimeError_, match="MSHIP_RAY_ADDRESS"):
        RayRuntime().launch(launch())
