"""Following an engine's log holds a thread: at most one per (user, deployment, replica),
the older follow ended by a newer one (its stream closes with an `end` event saying so), and
none left once the client has gone. Through the real server, on the process runtime."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User

from deployments import deployer, log_followers
from deployments.api.tokens import issue_token
from tests.conftest import chat, wait_until
from tests.docker_support import docker_block

if TYPE_CHECKING:
    from collections.abc import Iterator

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


def followers_of(deployment: Deployment) -> list[threading.Thread]:
    """The pump threads following this deployment's log (engine_logs.follow names them)."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("log-follow-") and t.name.split("-")[3] == str(deployment.pk)
    ]


def events(lines: Iterator[str]) -> Iterator[str]:
    """The SSE lines of a stream that carry something (data, event), comments skipped."""
    for line in lines:
        if line and not line.startswith(":"):
            yield line


@pytest.fixture
def logged(make_deployment: Any) -> Deployment:
    deployment: Deployment = make_deployment("logged")
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    return deployment


def token_of(name: str) -> str:
    return issue_token(User.objects.create_superuser(name, f"{name}@example.com", "pw-123456"))


def follow(gateway_url: str, deployment: Deployment, token: str) -> Any:
    return httpx.stream(
        "GET",
        f"{gateway_url}/api/deployments/{deployment.pk}/logs/?follow=1",
        headers={"authorization": f"Token {token}", "accept": "text/event-stream"},
        timeout=30,
    )


def test_it_ends_a_users_older_follow_when_it_follows_again(
    gateway_url: str, logged: Deployment
) -> None:
    ops, other = token_of("ops"), token_of("other")
    with (
        follow(gateway_url, logged, ops) as first,
        follow(gateway_url, logged, other) as others,
    ):
        first_lines, others_lines = first.iter_lines(), others.iter_lines()
        assert next(first_lines) == ": following"
        assert next(others_lines) == ": following"
        with follow(gateway_url, logged, ops) as second:
            second_lines = second.iter_lines()
            assert next(second_lines) == ": following"
            ended = list(events(first_lines))
            assert ended == ["event: end", f"data: {log_followers.REPLACED}"]
            wait_until(lambda: len(followers_of(logged)) == 2)  # ops's newer, other's
            chat(logged.engine_url)  # the newer follow and the other user's still run
            assert next(events(second_lines)) == "data: POST /v1/chat/completions"
            assert next(events(others_lines)) == "data: POST /v1/chat/completions"


@pytest.mark.parametrize("runtime", ["process", "docker"])
def test_it_stops_following_when_the_client_leaves(
    gateway_url: str, make_deployment: Any, runtime: str, request: pytest.FixtureRequest
) -> None:
    # A quiet engine: Docker's log stream blocks until its next line, which never comes.
    extra: dict[str, Any] = {}
    if runtime == "docker":
        request.getfixturevalue("docker_site")
        extra = {"runtime": "docker", "docker_options": docker_block()}
    logged: Deployment = make_deployment("quiet", **extra)
    deployer.restart(logged.pk)
    logged.refresh_from_db()
    token = token_of("ops")
    for _ in range(5):  # a page reloaded, each time leaving its stream open-ended
        with follow(gateway_url, logged, token) as stream:
            lines = stream.iter_lines()
            assert next(lines) == ": following"
            # Its pump started before that line was sent: none here means it ended at once.
            if not followers_of(logged):
                pytest.fail(f"the follow ended at once: {list(events(lines))}")
    wait_until(lambda: not followers_of(logged))
    assert log_followers.following() == 0


def test_it_stops_a_follower_whose_reader_left_with_its_queue_full(
    gateway_url: str, logged: Deployment
) -> None:
    token = token_of("ops")
    with follow(gateway_url, logged, token) as stream:
        lines = stream.iter_lines()  # kept: dropping it would close the stream
        assert next(lines) == ": following"
        # The engine's log grows far faster than this client reads (it reads nothing more):
        # the socket's buffers fill, then the follower's queue.
        with open(logged.runtime_handle["replicas"][0]["log"], "a") as log:
            log.write(("x" * 99 + "\n") * 300_000)
        wait_until(lambda: log_followers.backlog() >= log_followers.QUEUE_LINES)
    wait_until(lambda: not followers_of(logged))
