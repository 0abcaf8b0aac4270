"""The gateway served for real: the project's ASGI application under the server `serve` runs
(uvicorn with Modelship's limits), in a thread of the test process (so the test can watch its
database queries), for the whole session."""

from __future__ import annotations

import asyncio
import functools
import http.client
import io
import json
import secrets
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import httpx2
import openai
import pytest
import uvicorn

from deployments import deployer
from deployments.models import Deployment, State
from deployments.runtimes.process import free_port
from modelship_site.asgi import application
from modelship_site.server import config
from ondemand import gateway
from openai_api.access import writer
from openai_api.catalog import catalog
from openai_api.forwarder import forwarder
from openai_api.models import ApiKey
from tests.conftest import REPO, answers, env_for_subprocess, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@pytest.fixture(scope="session")
def gateway_url(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    port = free_port("127.0.0.1")
    # The server `serve` runs, with its limits.
    server = uvicorn.Server(config(application, "127.0.0.1", port, log_level="warning"))
    with django_db_blocker.unblock():
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_until(lambda: server.started, 30)
        url = f"http://127.0.0.1:{port}"
        SERVER.append(url)
        yield url
        if catalog.loop is not None:
            asyncio.run_coroutine_threadsafe(forwarder.close(), catalog.loop).result(10)
        server.should_exit = True
        thread.join(30)


SERVER: list[str] = []


def seen_by_gateway(predicate: Callable[[Any], bool]) -> None:
    """Wait until the gateway's catalog shows what the test just wrote."""
    if catalog.snapshot is None:
        httpx.get(SERVER[0] + "/v1/models")  # the catalog loads on the first request
    catalog.request_refresh()

    def shows() -> bool:
        try:
            return catalog.snapshot is not None and predicate(catalog.snapshot)
        except KeyError:  # a name the table loaded before the test's write does not hold yet
            return False

    wait_until(shows, 10)


@pytest.fixture
def api_key(transactional_db: None, site: Any, gateway_url: str) -> Callable[..., str]:
    """Keys the in-process gateway knows (so it runs: seen_by_gateway asks it)."""
    site.MSHIP_ROUTE_REFRESH_S = 0.05

    def make(name: str = "app", **fields: Any) -> str:
        key, secret = ApiKey.issue(name, **fields)
        seen_by_gateway(lambda s: key.prefix in s.keys)
        return secret

    return make


@pytest.fixture
def serving(
    make_deployment: Any, engines: None, site: Any, gateway_url: str
) -> Callable[..., Deployment]:
    """A deployment started and visible to the in-process gateway as ready."""
    site.MSHIP_ROUTE_REFRESH_S = 0.05

    def start(name: str = "sim", **fields: Any) -> Deployment:
        deployment: Deployment = make_deployment(name, **fields)
        deployer.restart(deployment.pk)
        deployment.refresh_from_db()
        assert deployment.state == State.READY, deployment.state_reason
        seen_by_gateway(
            lambda s: (
                name in s.routes
                and s.routes[name].urls == tuple(deployment.engine_urls)
                and s.routes[name].state == "ready"
            )
        )
        return deployment

    return start


def reread_guard() -> None:
    """The gateway reads its peer policy and key file again on the next request (they are
    otherwise read every 30 s and at most once a second)."""
    gateway.application.policy = None
    gateway.application.read_at = float("-inf")
    gateway.keyfile.checked_at = float("-inf")
    gateway.failures.clear()


PEER = "127.0.0.2"  # an allowed peer: the test's explicit list names it
OTHER = "127.0.0.3"  # on the loopback network too, but not in the list


@dataclass
class OnDemandSite:
    url: str
    key: str
    key_file: Path

    def client(self, deployment: Deployment, source: str = PEER, **headers: str) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.url}/ondemand/{deployment.pk}/v1",
            headers={"authorization": f"Bearer {self.key}", **headers},
            transport=httpx.HTTPTransport(local_address=source),
            timeout=60,
        )

    def sdk(self, deployment: Deployment, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/ondemand/{deployment.pk}/v1",
            api_key=key or self.key,
            max_retries=0,
            # The SDK's own HTTP client, from the allowed peer address.
            http_client=openai.DefaultHttpxClient(
                transport=httpx2.HTTPTransport(local_address=PEER)
            ),
        )

    def raw(self, method: str, path: str, source: str = PEER, **headers: str) -> tuple[int, str]:
        """A request whose path goes out byte for byte (no client-side normalisation)."""
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(
            parts.hostname or "", parts.port, timeout=30, source_address=(source, 0)
        )
        conn.request(
            method, path, body=b"{}", headers={"authorization": f"Bearer {self.key}", **headers}
        )
        response = conn.getresponse()
        body = response.read()
        conn.close()
        return response.status, (json.loads(body)["error"]["code"] if body else "")


@pytest.fixture
def ondemand_site(
    gateway_url: str, site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[OnDemandSite]:
    # The test machine may itself be a container, but not one the test's Docker daemon (if
    # any) runs: the gateway has no Docker networks of its own here.
    monkeypatch.setenv("MSHIP_IN_CONTAINER", "0")
    key_file = tmp_path / "ondemand_key"
    key = "odk-" + secrets.token_hex(16)
    key_file.write_text(key + "\n")
    site.MSHIP_ONDEMAND_KEY_FILE = key_file
    site.MSHIP_ONDEMAND_ALLOWED_CIDRS = f"{PEER}/32"
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    reread_guard()
    yield OnDemandSite(gateway_url, key, key_file)
    reread_guard()


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    """The access lines the in-process gateway writes (to stdout, in a real server)."""
    lines: list[dict[str, Any]] = []

    class Keep(io.StringIO):
        def write(self, text: str) -> int:
            lines.extend(json.loads(line) for line in text.splitlines())
            return len(text)

    previous, writer.stream = writer.stream, Keep()
    yield lines
    writer.stream = previous


def server(tmp_path: Path, site: Any, name: str, metrics_dir: Path) -> tuple[str, Any]:
    port = free_port("127.0.0.1")
    env = env_for_subprocess(
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        MSHIP_VAR_DIR=str(tmp_path / "var"),
        MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
        MSHIP_ENGINE_LOG_DIR=str(site.MSHIP_ENGINE_LOG_DIR),
        MSHIP_MEMORY_CAPACITY_GIB="8",
        MSHIP_ROUTE_REFRESH_S="0.2",
        MSHIP_METRICS_KEY_PREFIXES="1",  # test_metrics checks the counts by key
        MSHIP_USAGE_FLUSH_S="0.2",  # test_usage: budgets across the two, soon
        MSHIP_BUDGET_REFRESH_S="0.2",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / f"{name}.out").open("wb"),
        stderr=(tmp_path / f"{name}.err").open("wb"),
    )
    return f"http://127.0.0.1:{port}", process


@pytest.fixture
def two_gateways(tmp_path: Path, site: Any, transactional_db: None) -> Iterator[list[str]]:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    started = [server(tmp_path, site, name, metrics_dir) for name in ("a", "b")]
    try:
        for url, _ in started:
            wait_until(functools.partial(answers, url + "/health"), 60)
        yield [url for url, _ in started]
    finally:
        for _, process in started:
            process.terminate()
            process.wait(30)


REDIS = "redis://127.0.0.1:6379/0"


def start_gateway(tmp_path: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
        cwd=REPO,
        env=env_for_subprocess(
            MSHIP_VAR_DIR=str(tmp_path / "var"),
            MSHIP_ROUTE_REFRESH_S="0.05",
            MSHIP_MEMORY_CAPACITY_GIB="8",
            **env,
        ),
    )
    wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), 60)
    return process


@pytest.fixture(scope="module")
def other_gateway(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """Another gateway process on the tests' database, with Redis for what is shared through
    it: started once for the module's tests (the database is the same for each of them,
    emptied between them), with the run folder they share with it (one start-up gate)."""
    folder = tmp_path_factory.mktemp("other-gateway")
    port = free_port("127.0.0.1")
    process = start_gateway(folder, port, REDIS_URL=REDIS, MSHIP_RUN_DIR=str(folder / "run"))
    try:
        yield f"http://127.0.0.1:{port}", folder / "run"
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture
def other(other_gateway: tuple[str, Path], site: Any, transactional_db: None) -> str:
    """The other gateway's URL; this test's run folder is the one it has."""
    url, site.MSHIP_RUN_DIR = other_gateway
    return url
