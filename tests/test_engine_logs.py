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
from deployments.runtimes.process import ProcessRuntime
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
    # What a browser's EventSource asks for.
    response = await client.get(
        f"/api/deployments/{deployment.pk}/logs/?follow=1", headers={"Accept": "text/event-stream"}
    )
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


def test_it_refuses_a_follow_before_the_stream_as_an_error_event(staff: User) -> None:
    client = Client()
    client.force_login(staff)
    answer = client.get(
        "/api/deployments/9999/logs/?follow=1", headers={"Accept": "text/event-stream"}
    )
    assert answer.status_code == 404
    assert answer["Content-Type"].startswith("text/event-stream")
    assert answer.content.decode().startswith("event: error\ndata: {")


def test_it_shows_the_log_tail_in_the_admin(
    make_deployment: Any, staff: User, request: Any
) -> None:
    deployment = started(make_deployment, "process", request)
    client = Client()
    client.force_login(staff)
    page = client.get(f"/admin/deployments/deployment/{deployment.pk}/change/")
    assert "simulated engine: serving" in page.content.decode()


@pytest.mark.parametrize("lines", [1, 3, 2000])
def test_it_reads_a_long_logs_tail_from_its_end(tmp_path: Any, lines: int) -> None:
    """A log of many 64 KiB blocks: the tail is the last lines whole, and nothing before the
    run's offset (an earlier run's lines) is shown however few lines the run has."""
    log = tmp_path / "engine.log"
    earlier = b"".join(b"earlier run line %d\n" % i for i in range(200_000))
    log.write_bytes(earlier + b"".join(b"line %d of this run\n" % i for i in range(5000)))
    handle = {"runtime": "process", "log": str(log), "log_offset": len(earlier)}
    tail = ProcessRuntime().log_tail(handle, lines).splitlines()
    assert tail == [f"line {i} of this run" for i in range(5000 - lines, 5000)]
    assert ProcessRuntime().log_tail(handle, 10_000).splitlines()[0] == "line 0 of this run"
    log.write_bytes(earlier + b"no newline at the end")
    assert ProcessRuntime().log_tail(handle, lines) == "no newline at the end"


def test_it_reads_the_tail_of_a_log_larger_than_memory(tmp_path: Any) -> None:
    """64 GiB of log (sparse: months of an engine's output) before its last lines: read
    whole, it would not fit in this machine's memory."""
    log = tmp_path / "engine.log"
    with log.open("wb") as f:
        f.truncate(64 * 1024**3)
        f.seek(0, 2)
        f.write(b"\nsecond to last\nthe last line\n")
    handle = {"runtime": "process", "log": str(log), "log_offset": 0}
    assert ProcessRuntime().log_tail(handle, 2).splitlines() == ["second to last", "the last line"]
