"""What /api shows of secrets: a deployment's environment, secret-named config options and
secret flags' values only to a user who may set them (run_arbitrary_engine); no URL's
credentials in /api/host (issue 35, item 5)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from common.redact import MASK
from deployments.models import Deployment
from ondemand.models import LiteLLMStatus

CHANGE = ("view_deployment", "change_deployment")
ENGINE_RUNNER = (*CHANGE, "run_arbitrary_engine")
SECRETS = {
    "name": "c",
    "model": "m",
    "loader": "vllm",
    "runtime": "docker",
    "memory_gib": 1,
    "docker_options": {"environment": {"HF_TOKEN": "hf_secret_value"}, "shm_size": "1g"},
    "command": ["python", "-m", "x", "--api-key", "sk-secret-value", "--port=8000"],
    "config": {"api_key": "sk-config-secret", "max_model_len": 7},
}


def client_of(name: str, perms: tuple[str, ...]) -> APIClient:
    user = User.objects.create_user(name, password="pw-123456", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


@pytest.fixture
def created(transactional_db: None) -> dict[str, Any]:
    root = APIClient()
    root.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-1234567"))
    answer = root.post("/api/deployments/", SECRETS, format="json")
    assert answer.status_code == 201, answer.json()
    shown: dict[str, Any] = answer.json()
    assert "hf_secret_value" in str(shown)  # the superuser sees what it set
    return shown


def test_it_masks_secrets_for_a_user_who_may_not_set_them(created: dict[str, Any]) -> None:
    editor = client_of("editor", CHANGE)
    for path in (f"/api/deployments/{created['id']}/", "/api/deployments/"):
        answer = editor.get(path)
        assert answer.status_code == 200
        assert "secret" not in answer.content.decode(), path
    shown = editor.get(f"/api/deployments/{created['id']}/").json()
    assert shown["docker_options"] == {"environment": {"HF_TOKEN": MASK}, "shm_size": "1g"}
    assert shown["command"] == ["python", "-m", "x", "--api-key", MASK, "--port=8000"]
    assert shown["config"] == {"api_key": MASK, "max_model_len": 7}


def test_it_shows_them_to_a_user_with_run_arbitrary_engine(created: dict[str, Any]) -> None:
    runner = client_of("runner", ENGINE_RUNNER)
    shown = runner.get(f"/api/deployments/{created['id']}/").json()
    assert shown["docker_options"] == SECRETS["docker_options"]
    assert shown["command"] == SECRETS["command"]
    assert shown["config"] == SECRETS["config"]


def test_it_keeps_the_stored_secrets_when_a_masked_answer_is_sent_back(
    created: dict[str, Any],
) -> None:
    editor = client_of("editor", CHANGE)
    path = f"/api/deployments/{created['id']}/"
    shown = editor.get(path).json()
    # The whole answer back (a PUT), then the masked config sent back beside another change.
    assert editor.put(path, shown, format="json").status_code == 200
    change = {"config": shown["config"], "idle_timeout_s": 120}
    answer = editor.patch(path, change, format="json")
    assert answer.status_code == 200, answer.json()
    stored = Deployment.objects.get(pk=created["id"])
    assert stored.docker_options == SECRETS["docker_options"]
    assert stored.command == SECRETS["command"]
    assert stored.config == SECRETS["config"] and stored.idle_timeout_s == 120
    # Changing an option of a deployment with its own command takes the permission
    # (deployments/host_access.py), masked or not.
    config = {**shown["config"], "max_model_len": 9}
    assert editor.patch(path, {"config": config}, format="json").status_code == 403


def test_it_never_shows_a_urls_credentials_on_the_host(
    transactional_db: None, settings: Any
) -> None:
    settings.MSHIP_RAY_ADDRESS = "http://ray-user:ray-pass@127.0.0.1:9/"
    LiteLLMStatus.objects.create(
        pk=1, ok=False, error="Cannot connect to http://admin:litellm-pass@proxy:4000/?key=sk-1"
    )
    viewer = client_of("viewer", ("view_deployment",))
    answer = viewer.get("/api/host")
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "pass" not in text
    assert "sk-1" not in text
    body = answer.json()
    assert body["ray"]["address"] == f"http://{MASK}@127.0.0.1:9/"
    assert body["ondemand"]["litellm_error"].startswith(f"Cannot connect to http://{MASK}@proxy")
