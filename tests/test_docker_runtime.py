"""Engines as containers on a real Docker Engine."""

from __future__ import annotations

import ast
import ipaddress
import json
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import docker
import pytest
import yaml
from django.core.management import call_command
from django_q.brokers import get_broker

from deployments import deployer
from deployments.adoption import adopt_all
from deployments.models import Deployment, State
from deployments.runtimes import get_runtime
from deployments.runtimes.docker_network import attached_networks
from deployments.watchdog import check_once
from openai_api.catalog import route_of
from openai_api.mcp.egress import Policy, host_networks, normalise
from tests.conftest import REPO, chat, env_for_subprocess, reply_of, wait_until
from tests.docker_support import docker_block, engine_volumes

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines", "docker_site")


def container(make_deployment: Any, name: str = "box", **fields: Any) -> Deployment:
    values: dict[str, Any] = {"runtime": "docker", "docker_options": docker_block()}
    values.update(fields)
    deployment: Deployment = make_deployment(name, **values)
    return deployment


def running(deployment: Deployment) -> Deployment:
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    return deployment


def container_of(client: Any, deployment: Deployment) -> Any:
    return client.containers.get(deployment.runtime_handle["replicas"][0]["container_id"])


def test_it_runs_the_simulated_engine_as_a_container(
    make_deployment: Any, docker_client: Any, site: Any
) -> None:
    deployment = running(container(make_deployment, config={"reply": "from a box"}))
    assert deployment.engine_url.startswith("http://127.0.0.1:")
    assert reply_of(deployment.engine_url) == "from a box"
    box = container_of(docker_client, deployment)
    assert box.labels["modelship.deployment_id"] == str(deployment.pk)
    assert box.labels["modelship.fingerprint"] == deployment.running_fingerprint
    assert box.labels["modelship.site"] == site.MSHIP_SITE
    assert box.name == f"{site.MSHIP_SITE}-box-0"
    assert box.attrs["HostConfig"]["Init"] is True
    assert box.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert "modelship-test" in box.attrs["NetworkSettings"]["Networks"]
    # The engines' network is recorded, so MCP egress refuses its addresses.
    address = box.attrs["NetworkSettings"]["Networks"]["modelship-test"]["IPAddress"]

    networks = route_of(deployment).networks
    policy = Policy(frozenset(), (), host_networks(networks), False)
    assert networks and "Modelship's engines" in str(policy.verdict("x", normalise(address)))

    assert deployer.stop(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert not docker_client.containers.list(
        all=True, filters={"label": f"modelship.site={site.MSHIP_SITE}"}
    )


def test_it_deploys_the_same_models_yaml_on_both_runtimes(tmp_path: Path) -> None:
    for runtime in ("process", "docker"):
        entry: dict[str, Any] = {
            "name": f"same-{runtime}",
            "model": "simulated",
            "loader": "simulated",
            "memory_gib": 1,
            "runtime": runtime,
            "simulated_config": {"reply": "same"},
        }
        if runtime == "docker":
            entry["docker"] = docker_block()
        path = tmp_path / f"{runtime}.yaml"
        path.write_text(yaml.safe_dump({"models": [entry]}))
        call_command("deploy", file=str(path), wait=True)
        assert reply_of(Deployment.objects.get(name=f"same-{runtime}").engine_url) == "same"


def test_it_kills_a_container_that_ignores_sigterm_after_the_grace_period(
    make_deployment: Any, docker_client: Any, site: Any
) -> None:
    site.MSHIP_STOP_GRACE_S = 2.0
    deployment = running(container(make_deployment, config={"ignore_sigterm": True}))
    began = time.monotonic()
    assert deployer.stop(deployment.pk)
    took = time.monotonic() - began
    assert took < 2.0 + 8.0  # the grace, then SIGKILL: not docker's full default wait
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED


def test_it_fails_a_container_that_exits_at_start_with_code_and_log(
    make_deployment: Any,
) -> None:
    deployment = container(make_deployment, config={"fail_at_start": True})
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "the engine exited with code 1 during start-up" in deployment.state_reason
    assert "RuntimeError: injected start failure" in deployment.state_reason


def test_it_names_an_out_of_memory_kill(make_deployment: Any) -> None:
    deployment = container(
        make_deployment,
        config={"allocate_mib": 400},
        docker_options=docker_block(mem_limit="128m"),
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert deployment.state_reason.startswith("out of memory (killed) during start-up")


def test_it_fails_a_start_whose_image_cannot_be_pulled(make_deployment: Any) -> None:
    deployment = container(make_deployment, image="registry.invalid/nothing:1")
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert deployment.state_reason.startswith("cannot pull image 'registry.invalid/nothing:1'")


def test_it_adopts_a_ready_container_after_a_restart_without_restarting_it(
    tmp_path: Path, docker_client: Any, site: Any
) -> None:
    models = tmp_path / "models.yaml"
    entry = {
        "name": "kept",
        "model": "simulated",
        "loader": "simulated",
        "memory_gib": 1,
        "runtime": "docker",
        "docker": docker_block(),
        "simulated_config": {"reply": "kept"},
    }
    models.write_text(yaml.safe_dump({"models": [entry]}))
    env = env_for_subprocess(
        MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
        MSHIP_MEMORY_CAPACITY_GIB="8",
        MSHIP_SITE=site.MSHIP_SITE,
        MSHIP_DOCKER_NETWORK=site.MSHIP_DOCKER_NETWORK,
        MSHIP_CONTAINER_PYTHON=sys.executable,
        MSHIP_ENGINE_IMAGE=site.MSHIP_ENGINE_IMAGE,
    )
    subprocess.run(
        [sys.executable, "manage.py", "deploy", "-f", str(models), "--wait"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    kept = Deployment.objects.get(name="kept")
    before = container_of(docker_client, kept)
    started_at = before.attrs["State"]["StartedAt"]

    outcome = adopt_all()
    assert outcome["adopted"] == ["kept"] and outcome["orphans_removed"] == []
    after = container_of(docker_client, Deployment.objects.get(name="kept"))
    assert after.id == before.id
    assert after.attrs["State"]["StartedAt"] == started_at  # no restart
    assert reply_of(kept.engine_url) == "kept"


def test_it_replaces_a_container_whose_configuration_changed_while_down(
    make_deployment: Any, docker_client: Any
) -> None:

    deployment = running(container(make_deployment, config={"reply": "old"}))
    old_id = container_of(docker_client, deployment).id
    # Changed while Modelship was down: the row has the new configuration, the engine not.
    Deployment.objects.filter(pk=deployment.pk).update(config={"reply": "new"})
    get_broker().purge_queue()
    assert adopt_all()["replaced"] == ["box"]
    assert get_broker().queue_size() == 1  # the replacement, queued per the strategy
    deployer.replace(deployment.pk, "blue_green")
    deployment.refresh_from_db()
    assert container_of(docker_client, deployment).id != old_id
    assert reply_of(deployment.engine_url) == "new"


def test_it_removes_an_orphan_container_and_settles_a_vanished_one(
    make_deployment: Any, docker_client: Any
) -> None:
    orphan = running(container(make_deployment, "orphan"))
    orphan_box = container_of(docker_client, orphan)
    orphan.delete()  # its deployment is gone, its container is not
    vanished = running(container(make_deployment, "vanished"))
    container_of(docker_client, vanished).remove(force=True)

    outcome = adopt_all()
    assert outcome["orphans_removed"] == [orphan_box.name]
    assert outcome["stopped"] == ["vanished"]
    vanished.refresh_from_db()
    assert vanished.state == State.STOPPED

    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(orphan_box.id)


def test_it_notices_a_container_that_died_while_serving(make_deployment: Any) -> None:
    deployment = running(container(make_deployment, config={"crash_after_requests": 1}))
    chat(deployment.engine_url)
    handle = deployment.runtime_handle["replicas"][0]

    wait_until(lambda: not get_runtime("docker").is_alive(handle), 20)
    assert check_once() == ["box"]
    deployment.refresh_from_db()
    assert deployment.state_reason.startswith("the engine exited with code 3 while it served")


def test_it_finds_the_networks_of_its_own_container(
    docker_client: Any, engine_image: str, site: Any
) -> None:

    assert attached_networks(docker_client) == []  # the tests run outside a container
    network = get_runtime("docker").network()  # type: ignore[attr-defined]
    script = (
        "import json, docker\n"
        "from deployments.runtimes.docker_network import attached_networks\n"
        "print(json.dumps([n.__dict__ for n in attached_networks(docker.from_env())]))\n"
    )
    out = docker_client.containers.run(
        engine_image,
        [sys.executable, "-c", script],
        network=network.name,
        volumes=[*engine_volumes(), "/var/run/docker.sock:/var/run/docker.sock"],
        working_dir=str(REPO),
        remove=True,
    )
    [found] = json.loads(out)
    [ipam] = network.attrs["IPAM"]["Config"]
    subnet = ipaddress.ip_network(ipam["Subnet"])
    assert found == {
        "name": network.name,
        "subnets": [str(subnet)],
        "gateways": [ipam["Gateway"]],
        "first_hosts": [str(next(subnet.hosts()))],
    }


def test_it_calls_engines_by_address_when_it_runs_on_their_network(
    docker_client: Any, engine_image: str, site: Any, tmp_path: Path
) -> None:
    """Modelship itself in a container on the engines' network: no published port, the
    engine's address on that network, and the start reaches it there."""
    network = get_runtime("docker").network()  # type: ignore[attr-defined]
    models = tmp_path / "models.yaml"
    entry = {
        "name": "inner",
        "model": "simulated",
        "loader": "simulated",
        "memory_gib": 1,
        "runtime": "docker",
        "docker": docker_block(),
        "simulated_config": {"reply": "inner"},
    }
    models.write_text(yaml.safe_dump({"models": [entry]}))
    script = (
        "set -e; python=$0; $python manage.py migrate -v0; "
        f"$python manage.py deploy -f {models} --wait; "
        '$python manage.py shell -c "from deployments.models import Deployment; '
        "print(Deployment.objects.get(name='inner').engine_urls)\""
    )
    out = docker_client.containers.run(
        engine_image,
        ["/bin/sh", "-c", script, sys.executable],
        network=network.name,
        volumes=[
            *engine_volumes(),
            f"{tmp_path}:{tmp_path}",
            "/var/run/docker.sock:/var/run/docker.sock",
        ],
        working_dir=str(REPO),
        environment={
            "DATABASE_URL": f"sqlite:///{tmp_path}/inner.sqlite3",
            "MSHIP_VAR_DIR": str(tmp_path / "var"),
            "MSHIP_SITE": site.MSHIP_SITE,
            "MSHIP_DOCKER_NETWORK": network.name,
            "MSHIP_CONTAINER_PYTHON": sys.executable,
            "MSHIP_ENGINE_IMAGE": engine_image,
            "MSHIP_MEMORY_CAPACITY_GIB": "8",
        },
        remove=True,
    ).decode()
    assert "inner: ready" in out
    [url] = ast.literal_eval(out.strip().splitlines()[-1])  # the printed engine URLs
    [engine] = docker_client.containers.list(filters={"label": f"modelship.site={site.MSHIP_SITE}"})
    address = engine.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
    assert url == f"http://{address}:8000"
    assert engine.attrs["HostConfig"]["PortBindings"] in ({}, None)
