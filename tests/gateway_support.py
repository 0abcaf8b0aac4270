"""The gateway served for real: the project's ASGI application under the server `serve` runs
(uvicorn with Modelship's limits), in a thread of the test process (so the test can watch its
database queries), for the whole session."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvicorn

from deployments import deployer
from deployments.models import Deployment, State
from deployments.runtimes.process import free_port
from modelship_site.asgi import application
from modelship_site.server import config
from ondemand import gateway
from openai_api.catalog import catalog
from openai_api.forwarder import forwarder
from openai_api.models import ApiKey
from tests.conftest import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


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
    wait_until(lambda: catalog.snapshot is not None and predicate(catalog.snapshot), 10)


@pytest.fixture
def api_key(transactional_db: None, site: Any) -> Callable[..., str]:
    site.MSHIP_ROUTE_REFRESH_S = 0.05

    def make(name: str = "app", **fields: Any) -> str:
        key, secret = ApiKey.issue(name, **fields)
        seen_by_gateway(lambda s: key.prefix in s.keys)
        return secret

    return make


@pytest.fixture
def serving(make_deployment: Any, engines: None, site: Any) -> Callable[..., Deployment]:
    """A deployment started and visible to the gateway as ready."""
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
