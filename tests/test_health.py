"""/health answers while the process lives; /readyz waits for every always-on deployment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User

from deployments import deployer

if TYPE_CHECKING:
    from django.test import Client


def test_it_answers_liveness_without_a_database(client: Client) -> None:
    answer = client.get("/health")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    assert answer["X-Request-Id"]


def test_it_keeps_a_callers_request_id(client: Client) -> None:
    answer = client.get("/health", HTTP_X_REQUEST_ID="abc-123")
    assert answer["X-Request-Id"] == "abc-123"
    assert client.get("/health", HTTP_X_REQUEST_ID="bad id\n")["X-Request-Id"] != "bad id\n"


@pytest.mark.usefixtures("engines")
def test_it_is_not_ready_until_every_always_on_deployment_is(
    client: Client, make_deployment: Any
) -> None:

    pinned = make_deployment("pinned")
    make_deployment("lazy", mode="on_demand")
    anonymous = client.get("/readyz")
    assert anonymous.status_code == 503
    assert anonymous.json() == {"status": "not_ready"}  # no names or reasons to anyone
    client.force_login(User.objects.create_user("ops", password="pw-123456", is_staff=True))
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {
        "status": "not_ready",
        "deployments": {"pinned": {"state": "planned", "reason": ""}},
    }
    deployer.restart(pinned.pk)
    answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.json()["deployments"] == {"pinned": {"state": "ready", "reason": ""}}
