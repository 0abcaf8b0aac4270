"""Engine logs through the API: the tail of each replica, and one followed live (SSE)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connection
from django.test import AsyncClient, Client
from rest_framework.test import APIClient

from deployments import deployer
from tests.conftest import chat
from tests.docker_support import docker_block

if TYPE_CHECKING:
    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


def close_connection() -> None:
    connection.close()  # looked up here, in the thread whose connection it is


@pytest.fixture
def staff(transactional_db: None) -> User:
    return User.objects.create_superuser("ops", "o@example.com", "pw-123456")


def started(make_deployment: Any, runtime: str, request: Any) -> Deployment:
    extra: dict[str, Any] = {}
    if runtime == "docker":
        request.getfixturevalue("docker_site")
        extra = {"runtime": "docker", "docker_options": docker_block()}
    deployment: Deployment = make_deployment("logged", **extra)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    return deployment


@pytest.mark.parametrize("runtime", ["process", "docker"])
def test_it_returns_the_tail_of_the_engine_log(
    make_deployment: Any, staff: User, runtime: str, request: Any
) -> None:
    deployment = started(make_deployment, runtime, request)
    chat(deployment.engine_url)
    api = APIClient()
    api.force_authenticate(staff)
    body = api.get(f"/api/deployments/{deployment.pk}/logs/?tail=2").json()
    assert body["name"] == "logged"
    [replica] = body["replicas"]
    assert replica["replica"] == 0
    assert replica["lines"][-1] == "POST /v1/chat/completions"
    assert len(replica["lines"]) == 2
    assert api.get(f"/api/deployments/{deployment.pk}/logs/?tail=0").status_code == 400


def test_it_keeps_a_process_engines_log_after_it_stopped(
    make_deployment: Any, staff: User, request: Any
) -> None:
    deployment = started(make_deployment, "process", request)
    deployer.stop(deployment.pk)
    api = APIClient()
    api.force_authenticate(staff)
    lines = api.get(f"/api/deployments/{deployment.pk}/logs/").json()["replicas"][0]["lines"]
    assert any("simulated engine: serving" in line for line in lines)


@pytest.mark.parametrize("runtime", ["process", "docker"])
async def test_it_follows_the_engine_log_as_server_sent_events(
    make_deployment: Any, staff: User, runtime: str, request: Any
) -> None:

    deployment = await sync_to_async(started)(make_deployment, runtime, request)
    client = AsyncClient()
    await client.aforce_login(staff)
    response = await client.get(f"/api/deployments/{deployment.pk}/logs/?follow=1")
    assert response["Content-Type"] == "text/event-stream"
    stream = aiter(cast("Any", response).streaming_content)
    assert await anext(stream) == b": following\n\n"
    await sync_to_async(chat)(deployment.engine_url)
    assert await anext(stream) == b"data: POST /v1/chat/completions\n\n"
    await sync_to_async(deployer.stop)(deployment.pk)
    rest = [chunk async for chunk in stream]
    assert rest[-1] == b"event: end\ndata: the engine is gone\n\n"
    # The ORM ran in sync_to_async's thread: close its connection, or the test database
    # cannot be dropped at the end.
    await sync_to_async(close_connection)()


def test_it_shows_the_log_tail_in_the_admin(
    make_deployment: Any, staff: User, request: Any
) -> None:
    deployment = started(make_deployment, "process", request)
    client = Client()
    client.force_login(staff)
    page = client.get(f"/admin/deployments/deployment/{deployment.pk}/change/")
    assert "simulated engine: serving" in page.content.decode()
