"""Deployments on the ray runtime, on the real local cluster of tests/ray_support.py: placed
by their resources on worker nodes and served from there through the gateway, started on
demand through the controller, failed and restarted elsewhere when their node is lost,
adopted after a restart, and shown on /api/host."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from rest_framework.test import APIClient

from deployments import adoption, deployer, scaling
from deployments.models import Deployment, DeploymentEvent, State
from deployments.ray_cluster import ray_runtime
from deployments.runtimes import Launch
from deployments.watchdog import check_once
from tests.conftest import run_queue, wait_until
from tests.gateway_support import seen_by_gateway
from tests.ray_support import SIM_ENGINE

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.ray_support import Cluster

pytestmark = [pytest.mark.heavy, pytest.mark.usefixtures("engines")]

WORKER_GPUS = {"worker_a": 2, "worker_b": 1}
HI: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def on_ray(ray_cluster: Cluster, site: Any) -> Cluster:
    site.MSHIP_RAY_ADDRESS = ray_cluster.dashboard
    site.MSHIP_STOP_GRACE_S = 3
    return ray_cluster


def ray_fields(**fields: Any) -> dict[str, Any]:
    return {"runtime": "ray", "memory_gib": None, "num_gpus": 0, **fields}


def node_of(deployment: Deployment) -> str:
    deployment.refresh_from_db()
    (handle,) = deployment.runtime_handle["replicas"]
    return str(handle["node_id"])


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_it_serves_a_deployment_from_the_worker_node_ray_placed_it_on(
    on_ray: Cluster,
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    deployment = serving(
        "on-b",
        **ray_fields(num_gpus=1, ray_resources={"worker_b": 0.5}, config={"reply": "from b"}),
    )
    assert node_of(deployment) == on_ray.nodes["worker_b"]
    stream = sdk(gateway_url, api_key()).chat.completions.create(
        model="on-b", messages=HI, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "from b"

    ops = APIClient()
    ops.force_authenticate(User.objects.create_superuser("ops", "ops@example.com", "pw"))

    def nodes() -> dict[str, Any]:
        host = ops.get("/api/host").json()
        # Ray holds it, on its node: this host's budget is untouched.
        assert host["free_gib"] == host["capacity_gib"]
        return {node["node_id"]: node for node in host["ray"]["nodes"]}

    # Ray's usage report follows its scheduler within seconds.
    wait_until(lambda: nodes()[on_ray.nodes["worker_b"]]["gpus_used"] == 1, 30)
    on_b = nodes()[on_ray.nodes["worker_b"]]
    assert on_b["gpus"] == 1
    assert on_b["resources"]["worker_b"] == {"used": 0.5, "total": 1}
    assert [d["name"] for d in on_b["deployments"]] == ["on-b"]
    assert nodes()[on_ray.nodes["worker_a"]]["deployments"] == []

    (handle,) = deployment.runtime_handle["replicas"]
    assert deployer.stop(deployment.pk)
    assert not ray_runtime().is_alive(handle)


def test_it_starts_an_on_demand_deployment_on_ray_for_its_first_request(
    on_ray: Cluster,
    make_deployment: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    site: Any,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    lazy = make_deployment(
        "lazy-ray",
        mode="on_demand",
        **ray_fields(ray_resources={"worker_a": 0.5}, config={"reply": "woke on a"}),
    )
    seen_by_gateway(lambda s: "lazy-ray" in s.routes)
    answer = sdk(gateway_url, api_key()).chat.completions.create(model="lazy-ray", messages=HI)
    assert answer.choices[0].message.content == "woke on a"
    lazy.refresh_from_db()
    assert lazy.state == State.READY
    assert node_of(lazy) == on_ray.nodes["worker_a"]


def test_it_fails_a_deployment_whose_node_is_lost_and_restarts_it_on_another(
    on_ray: Cluster, make_deployment: Callable[..., Deployment], site: Any
) -> None:
    site.MSHIP_CRASH_RESTART_MIN_UPTIME_S = 0
    deployment = make_deployment("roaming", **ray_fields(num_gpus=1))
    deployer.restart(deployment.pk)
    first = node_of(deployment)
    lost = next(name for name, node in on_ray.nodes.items() if node == first)
    run_queue()  # nothing else of other tests is left to run
    try:
        os.kill(on_ray.raylet_pid(lost), signal.SIGKILL)
        wait_until(lambda: check_once() == ["roaming"], 60)
        deployment.refresh_from_db()
        assert deployment.state == State.FAILED
        assert "node has died" in deployment.state_reason
        assert DeploymentEvent.objects.filter(deployment=deployment, kind="restart_after_crash")
        assert [name for name, _ in run_queue()] == ["start"]  # as the cluster would
        deployment.refresh_from_db()
        assert deployment.state == State.READY, deployment.state_reason
        assert node_of(deployment) not in (first, on_ray.nodes["mship_head"])
    finally:
        on_ray.start_node(lost, gpus=WORKER_GPUS[lost])  # the cluster as the session found it


def test_it_adopts_its_ray_engines_after_a_restart_and_removes_jobs_no_deployment_owns(
    on_ray: Cluster, make_deployment: Callable[..., Deployment]
) -> None:
    kept = make_deployment("kept", **ray_fields())
    deployer.restart(kept.pk)
    stray = ray_runtime().launch(
        Launch(
            deployment_id=424242,
            name="gone",
            replica=0,
            argv=SIM_ENGINE,
            health_path="/health",
            fingerprint="0" * 16,
        )
    )
    outcome = adoption.adopt_all()
    assert outcome["adopted"] == ["kept"]
    # Jobs of earlier tests that ended are forgotten too.
    assert stray["job"] in outcome["orphans_removed"]
    assert not ray_runtime().is_alive(stray)
    assert [h["job"] for h in ray_runtime().managed() or []] == [node_job(kept)]


def node_job(deployment: Deployment) -> str:
    deployment.refresh_from_db()
    return str(deployment.runtime_handle["replicas"][0]["job"])


def test_it_serves_the_tiny_llama_model_from_a_worker_node(
    on_ray: Cluster,
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    tmp_path: Path,
) -> None:
    call_command("make_tiny_model", str(tmp_path / "tiny.gguf"))
    deployment = serving(
        "tiny-on-ray",
        **ray_fields(
            loader="llama_server",
            model=str(tmp_path / "tiny.gguf"),
            config={"n_ctx": 512},
            ray_resources={"worker_a": 0.5},
        ),
    )
    assert node_of(deployment) == on_ray.nodes["worker_a"]
    answer = sdk(gateway_url, api_key()).chat.completions.create(
        model="tiny-on-ray", messages=HI, max_tokens=8
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens > 0


def test_it_scales_a_ray_deployment_by_ray_jobs(
    on_ray: Cluster, make_deployment: Callable[..., Deployment], site: Any
) -> None:
    site.MSHIP_DRAIN_GRACE_S = 0.1
    scaling_config = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1}
    scaled = make_deployment(
        "scaled-ray",
        **ray_fields(ray_resources={"worker_a": 0.5}, autoscaling_config=scaling_config),
    )
    deployer.restart(scaled.pk)
    assert scaling.add_replica(scaled.pk, "by hand")
    scaled.refresh_from_db()
    jobs = [h["job"] for h in scaled.runtime_handle["replicas"]]
    assert len(jobs) == 2 and len(set(scaled.engine_urls)) == 2
    assert {h["node_id"] for h in scaled.runtime_handle["replicas"]} == {on_ray.nodes["worker_a"]}
    assert scaling.remove_replica(scaled.pk, "by hand")
    running = [h["job"] for h in ray_runtime().managed() or [] if h["status"] == "running"]
    assert running == jobs[:1]
