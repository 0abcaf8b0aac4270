"""The ray runtime's configuration and its failures that need no cluster: field errors for
what Ray cannot take, deployments left as they were while Ray is unreachable, the host's
cluster view saying why it is empty, fingerprints an upgrade does not change."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from deployments import deployer
from deployments.fingerprint import CONFIG_FIELDS, fingerprint
from deployments.models import Deployment, State
from deployments.ray_cluster import dashboard_key
from deployments.runtimes import EngineUnreachable
from deployments.watchdog import check_once

if TYPE_CHECKING:
    from collections.abc import Callable

SIM = {"name": "sim", "model": "simulated", "loader": "simulated", "runtime": "ray"}


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


@pytest.fixture
def ray_gone(site: Any) -> str:
    """A Ray address where nothing listens."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        site.MSHIP_RAY_ADDRESS = f"http://127.0.0.1:{closed.getsockname()[1]}"
    return str(site.MSHIP_RAY_ADDRESS)


def test_it_refuses_the_ray_runtime_without_an_address(api: APIClient, site: Any) -> None:
    site.MSHIP_RAY_ADDRESS = ""
    answer = api.post("/api/deployments/", SIM, format="json")
    assert answer.status_code == 400
    assert answer.json()["runtime"] == [
        "the ray runtime needs MSHIP_RAY_ADDRESS (the Ray dashboard's URL)"
    ]
    assert not Deployment.objects.exists()


def test_it_refuses_resources_ray_cannot_take(api: APIClient, ray_gone: str) -> None:
    bad = {"a100": 0, "GPU": 1, "fast": "yes", "big": 1e9}
    answer = api.post("/api/deployments/", {**SIM, "ray_resources": bad}, format="json")
    assert answer.status_code == 400
    assert answer.json()["ray_resources"] == [
        "a100: must be a number from 0 to 2^20, not 0",
        "GPU: set by num_gpus and memory_gib, not here",
        "fast: must be a number from 0 to 2^20, not 'yes'",
        "big: must be a number from 0 to 2^20, not 1000000000.0",
    ]
    listed = api.post("/api/deployments/", {**SIM, "ray_resources": ["a100"]}, format="json")
    assert listed.status_code == 400
    assert "ray_resources" in listed.json()
    on_process = {**SIM, "runtime": "process", "ray_resources": {"a100": 1}, "memory_gib": 1}
    assert api.post("/api/deployments/", on_process, format="json").json()["ray_resources"] == [
        "only the ray runtime places by resources"
    ]
    assert not Deployment.objects.exists()


def test_it_places_nothing_on_this_hosts_budget_for_ray(api: APIClient, ray_gone: str) -> None:
    """Ray places by its own resources: a start larger than this host is not refused here."""
    answer = api.post(
        "/api/deployments/",
        {**SIM, "memory_gib": 500, "num_replicas": 3, "ray_resources": {"a100": 1}},
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    host = api.get("/api/host").json()
    assert host["deployments"] == []
    assert host["ray"]["reachable"] is False
    assert host["ray"]["error"].startswith("Ray is unreachable: ")
    assert host["ray"]["nodes"] == []


def test_it_has_no_cluster_on_a_site_without_ray(api: APIClient, site: Any) -> None:
    site.MSHIP_RAY_ADDRESS = ""
    assert api.get("/api/host").json()["ray"] is None


def test_it_leaves_deployments_as_they_were_while_ray_is_unreachable(
    make_deployment: Callable[..., Deployment], ray_gone: str
) -> None:
    stopped = make_deployment("cold", runtime="ray", state=State.STOPPED)
    with pytest.raises(EngineUnreachable, match="Ray is unreachable"):
        deployer.restart(stopped.pk)
    stopped.refresh_from_db()
    assert stopped.state == State.STOPPED
    assert stopped.state_reason.startswith("Ray is unreachable: ")

    handle = {"runtime": "ray", "job": "mship-x", "url": "http://127.0.0.1:9", "replica": 0}
    serving = make_deployment(
        "warm",
        runtime="ray",
        state=State.READY,
        runtime_handle={"replicas": [handle]},
        engine_urls=[handle["url"]],
    )
    assert check_once() == []  # the watchdog cannot tell, so it fails nothing
    with pytest.raises(EngineUnreachable):
        deployer.stop(serving.pk)
    serving.refresh_from_db()
    assert (serving.state, serving.engine_urls) == (State.READY, [handle["url"]])


def test_it_keeps_the_fingerprints_of_deployments_made_before_ray_resources() -> None:
    """An upgrade must not make every running engine look changed (and replaced)."""
    before = {field: f"value of {field}" for field in CONFIG_FIELDS if field != "ray_resources"}
    assert fingerprint({**before, "ray_resources": {}}) == fingerprint(before)
    assert fingerprint({**before, "ray_resources": {"a100": 1}}) != fingerprint(before)


def test_it_spells_resources_as_the_dashboard_does() -> None:
    assert [dashboard_key(n) for n in ("worker_b", "a100", "node:10.0.0.1", "my_big_gpu")] == [
        "workerB",
        "a100",
        "node:10.0.0.1",
        "myBigGpu",
    ]
