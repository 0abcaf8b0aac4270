"""Deployments that name stored models: `store:NAME` resolved to the stored file when the
engine is built (a real llama.cpp serving it), the loader suggested by the format, what an
editor without host access may name, and the references that name nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from deployments import deployer
from deployments.loaders import EngineSpec
from deployments.models import Deployment, State
from deployments.store import pulls
from deployments.store.models import PullState, StoredModel
from deployments.tiny_model import write as write_tiny
from tests.conftest import run_queue
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def stored(site: Any, tmp_path: Path) -> Path:
    """A model store with the tiny GGUF pulled into it as `tiny`, and a folder of two
    quantizations as `quants`."""
    root = (tmp_path / "models").resolve()
    site.MSHIP_MODEL_DIRS = [str(root)]
    source = tmp_path / "models" / "incoming"
    (source / "quants").mkdir(parents=True)
    write_tiny(source / "tiny.gguf")
    write_tiny(source / "quants" / "a-Q8_0.gguf")
    write_tiny(source / "quants" / "a-Q4_0.gguf", seed=1)
    pulls.ask("tiny", str(source / "tiny.gguf"))
    pulls.ask("quants", str(source / "quants"))
    run_queue()
    assert set(StoredModel.objects.values_list("state", flat=True)) == {PullState.READY}
    return root / "store"


@pytest.fixture
def editor(transactional_db: None) -> APIClient:
    """May add and change deployments, not choose what runs on the host."""
    user = User.objects.create_user("editor", password="pw-123456", is_staff=True)
    codenames = ("view_deployment", "change_deployment", "add_deployment")
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_it_serves_a_stored_model_by_its_name_with_the_loader_its_format_suggests(
    stored: Path, editor: APIClient, gateway_url: str, api_key: Callable[..., str], site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    body = {"name": "tiny", "model": "store:tiny", "memory_gib": 0.5, "runtime": "process"}
    created = editor.post("/api/deployments/", body, format="json")
    assert created.status_code == 201, created.json()
    assert (created.json()["loader"], created.json()["usecase"]) == ("llama_server", "generate")
    deployment = deployer.restart(created.json()["id"])
    assert deployment.state == State.READY, deployment.state_reason
    seen_by_gateway(lambda s: "tiny" in s.routes and s.routes["tiny"].state == "ready")
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    pid = deployment.runtime_handle["replicas"][0]["pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert str(stored / "tiny" / "tiny.gguf").encode() in argv  # the stored file, resolved


def test_it_resolves_one_file_of_a_stored_folder_and_refuses_one_outside_it(
    stored: Path, editor: APIClient
) -> None:
    ok = {"name": "q4", "model": "store:quants/a-Q4_0.gguf", "memory_gib": 0.5}
    created = editor.post("/api/deployments/", ok, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["loader"] == "llama_server"
    spec = EngineSpec.of(Deployment.objects.get(name="q4"))
    assert spec.model == str(stored / "quants" / "a-Q4_0.gguf")
    for model in ("store:quants/../tiny/tiny.gguf", "store:quants/missing.gguf", "store:nope"):
        body = {"name": "bad", "model": model, "loader": "llama_server", "memory_gib": 0.5}
        refused = editor.post("/api/deployments/", body, format="json")
        assert refused.status_code == 400, model
        assert "model" in refused.json(), refused.json()


def test_it_asks_for_a_loader_where_the_model_suggests_none(
    stored: Path, editor: APIClient
) -> None:
    refused = editor.post("/api/deployments/", {"name": "x", "model": "some/model"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["loader"] == ["This field is required."]


def test_it_fails_a_start_of_a_model_still_being_pulled_saying_so(
    stored: Path, make_deployment: Any
) -> None:
    StoredModel.objects.create(name="later", source="hf:acme/later", state=PullState.PULLING)
    deployment = make_deployment("later", model="store:later", loader="llama_server")
    started = deployer.restart(deployment.pk)
    assert started.state == State.FAILED
    assert "the stored model 'later' is pulling, not ready" in started.state_reason


def test_it_takes_a_models_yaml_entry_naming_a_stored_model_without_a_loader(
    stored: Path, transactional_db: None
) -> None:
    root = User.objects.create_superuser("root", "r@example.com", "pw-123456")
    client = APIClient()
    client.force_authenticate(root)
    text = "models:\n  - name: chat\n    model: store:tiny\n    memory_gib: 0.5\n"
    applied = client.post("/api/apply", {"file": text}, format="json")
    assert applied.status_code == 200, applied.json()
    assert applied.json()["created"] == ["chat"]
    chat = Deployment.objects.get(name="chat")
    assert (chat.loader, chat.usecase, chat.model) == ("llama_server", "generate", "store:tiny")
