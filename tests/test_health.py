"""/health answers while the process lives; /readyz waits for every always-on deployment."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from deployments import deployer
from deployments.adoption import SHUTDOWN_REASON
from deployments.models import Deployment, State

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


@pytest.mark.usefixtures("engines")
def test_it_shows_readiness_detail_to_an_api_token_and_leaves_out_a_stop_on_purpose(
    client: Client, make_deployment: Any
) -> None:
    """The README's /api token sees what a signed-in staff user sees; an always-on
    deployment an operator stopped does not hold readiness at 503 for ever, one stopped by
    Modelship's shutdown (started again by the next serve) does until it is ready."""
    User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    out = io.StringIO()
    call_command("api_token", "ops", stdout=out)
    token = {"Authorization": f"Token {out.getvalue().strip()}"}
    pinned = make_deployment("pinned")
    shut = make_deployment("shut", state=State.STOPPED, state_reason=SHUTDOWN_REASON)
    deployer.restart(pinned.pk)
    answer = client.get("/readyz", headers=token)
    assert answer.status_code == 503
    assert answer.json()["deployments"] == {
        "pinned": {"state": "ready", "reason": ""},
        "shut": {"state": "stopped", "reason": SHUTDOWN_REASON},
    }
    wrong = client.get("/readyz", headers={"Authorization": "Token not-a-token"})
    assert wrong.status_code == 503 and wrong.json() == {"status": "not_ready"}
    Deployment.objects.filter(pk=shut.pk).update(state_reason="stopped by ops")
    answer = client.get("/readyz", headers=token)
    assert answer.status_code == 200
    assert answer.json()["deployments"] == {"pinned": {"state": "ready", "reason": ""}}
