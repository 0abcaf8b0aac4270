"""Modelship's own image (the Dockerfile) and its compose file (compose.yaml)."""

from __future__ import annotations

import hashlib
import subprocess
import time
import uuid
from typing import Any

import httpx
import pytest
import yaml

from deployments.site_hints import hints
from tests.conftest import REPO
from tests.image_support import ensure_base_image


@pytest.mark.heavy
def test_it_builds_modelships_image_from_a_local_base_and_answers_health(
    docker_client: Any,
) -> None:
    base = ensure_base_image(docker_client)
    tag = f"modelship-test-app:{hashlib.sha256(base.encode()).hexdigest()[:8]}"
    subprocess.run(
        ["docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", tag, str(REPO)],
        check=True,
        capture_output=True,
    )
    name = f"mstest-web-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(
        tag, name=name, detach=True, ports={"8000/tcp": ("127.0.0.1", None)}
    )
    try:
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        answer = None
        while time.monotonic() < deadline:
            container.reload()
            assert container.status == "running", container.logs().decode()[-3000:]
            try:
                answer = httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert answer is not None, container.logs().decode()[-3000:]
        assert (answer.status_code, answer.json()) == (200, {"status": "ok"})
        # Migrated on start, with nothing always on to wait for: ready.
        assert httpx.get(url + "/readyz", timeout=5).status_code == 200
        logs = container.logs().decode()
        assert "Sign in as 'admin'" in logs
    finally:
        container.remove(force=True)


def test_it_composes_postgres_redis_the_server_and_the_cluster() -> None:
    """compose.yaml, read as Docker Compose reads it (no compose plugin on this machine)."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"secrets", "web", "cluster", "pulls", "postgres", "redis"}
    web, cluster, pulls = services["web"], services["cluster"], services["pulls"]
    assert web["command"][-1] == "web" and cluster["command"][-1] == "cluster"
    assert pulls["command"][-1] == "pulls"
    for service in (web, cluster, pulls):
        env = service["environment"]
        # The URLs, with their generated passwords, come from files (tests/test_compose_secrets.py).
        assert env["DATABASE_URL_FILE"] == "/run/modelship/secrets/database_url"
        assert env["REDIS_URL_FILE"] == "/run/modelship/secrets/redis_url"
        # The engines' network is Modelship's own: `auto` admits its peers, and LiteLLM is
        # told the service's name.
        assert env["MSHIP_DOCKER_NETWORK"] == "modelship-engines"
        assert env["MSHIP_ONDEMAND_ALLOWED_CIDRS"] == "auto"
        assert env["MSHIP_INTERNAL_URL"] == "http://modelship:8000"
        # State, engine environments and the model cache at the same path as on the host.
        data = "${MSHIP_DATA:-/var/lib/modelship}"
        assert f"{data}:{data}" in service["volumes"]
        assert env["MSHIP_HF_HOME"] == f"{data}/hf"
        assert service["depends_on"]["postgres"] == {"condition": "service_healthy"}
    for service in (web, cluster):  # they start engines: the Docker Engine and the GPUs
        assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "modelship" in web["networks"]["modelship"]["aliases"]
    assert "modelship" in web["networks"]["engines"]["aliases"]
    assert compose["networks"]["modelship"]["name"] == "modelship"
    assert web["ports"] == ["127.0.0.1:8000:8000"]  # TLS goes in front


def test_it_says_what_a_bare_host_must_set(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setenv("MSHIP_IN_CONTAINER", "0")
    settings.MSHIP_LITELLM_URL = "http://litellm:4000"
    settings.MSHIP_INTERNAL_URL = "http://127.0.0.1:8000"
    settings.MSHIP_ONDEMAND_ALLOWED_CIDRS = "auto"
    said = hints()
    assert [hint.split(":")[0] for hint in said] == [
        "MSHIP_ONDEMAND_ALLOWED_CIDRS",
        "MSHIP_INTERNAL_URL",
    ]
    assert "outside a container that is nobody" in said[0]
    settings.MSHIP_ONDEMAND_ALLOWED_CIDRS = "172.17.0.0/16"
    settings.MSHIP_INTERNAL_URL = "http://172.17.0.1:8000"
    assert hints() == []
    # In a container (compose), `auto` and the service's URL need nothing.
    settings.MSHIP_ONDEMAND_ALLOWED_CIDRS = "auto"
    monkeypatch.setenv("MSHIP_IN_CONTAINER", "1")
    assert hints() == []
